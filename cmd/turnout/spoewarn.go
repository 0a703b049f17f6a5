package main

import (
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/config"
)

// warnSPOEFromFlag warns when the rendered agent address came from --out
// rather than the config: serve cannot know that directory unless given
// --haproxy-dir with the same one, and without an agent HAProxy fails open
// (sessions and prefix affinity stop silently). serve warns from its side
// too (control/spoecheck.go).
func warnSPOEFromFlag(cfg *config.Config, dir string, log *zerolog.Logger) {
	if cfg.HAProxy.Path != config.HAProxyPathSPOE || cfg.HAProxy.SPOE != "" {
		return
	}
	if cfg.HAProxy.Dir != "" {
		if abs, err := filepath.Abs(cfg.HAProxy.Dir); err == nil && abs == dir {
			return // haproxy.dir: the config decides
		}
	}
	log.Warn().Str("spoe", haproxy.SPOEAddr(cfg, dir)).Str("field", "haproxy.spoe").
		Msg("the SPOE agent address comes from --out, not from the config: run serve with --haproxy-dir " + dir +
			", or set haproxy.spoe (or haproxy.dir) so the config alone decides where the agent listens")
}
