package epp

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/turnout/turnout/internal/tick"
)

// The gRPC health services of the protocol: liveness serves while the
// process runs; readiness and the ext_proc service serve while turnout's
// /readyz would say ready (the first health round done, every pool at its
// min_ready). Every turnout instance is active: there is no leader, so no
// follower ever reports NOT_SERVING for being one.

// readinessEvery is how often readiness is recomputed for the health
// services (Watch streams see each change).
const readinessEvery = time.Second

func (s *Server) setHealth(hs *health.Server) {
	var b strings.Builder
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.d.WriteReadiness(&b, false) {
		st = healthpb.HealthCheckResponse_SERVING
	}
	hs.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(HealthReadiness, st)
	hs.SetServingStatus(HealthExtProc, st)
}

// followReadiness keeps the services' status current until ctx ends.
func (s *Server) followReadiness(ctx context.Context, hs *health.Server) {
	tick.Every(ctx, readinessEvery, func(context.Context) bool {
		s.setHealth(hs)
		return true
	})
}
