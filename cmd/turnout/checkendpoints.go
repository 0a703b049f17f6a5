package main

import (
	"context"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/health"
)

// checkEndpoints asks every static endpoint for its served models
// (turnout check's step 2); an endpoint that does not answer is a
// warning, or with requireEP a problem. It returns the problems found.
func checkEndpoints(ctx context.Context, cfg *config.Config, timeout time.Duration, requireEP bool, log *zerolog.Logger) (problems int) {
	for _, p := range health.ProbeEndpoints(ctx, cfg, newProbeClient(timeout)) {
		switch {
		case p.Err == nil:
			log.Info().Str("check", "endpoint").Str("field", p.Path).Str("endpoint", p.Name).Str("address", p.Address).
				Strs("models", p.Models).Msg("endpoint answers")
		case requireEP:
			problems++
			log.Error().Str("check", "endpoint").Str("field", p.Path).Int("line", cfg.Line(p.Path)).Str("endpoint", p.Name).
				Str("address", p.Address).Err(p.Err).Msg("endpoint unreachable")
		default:
			log.Warn().Str("check", "endpoint").Str("field", p.Path).Int("line", cfg.Line(p.Path)).Str("endpoint", p.Name).
				Str("address", p.Address).Err(p.Err).Msg("endpoint unreachable (a warning; --require-endpoints makes it a problem)")
		}
	}
	return problems
}

// newProbeClient bounds one /v1/models call.
func newProbeClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout}
}
