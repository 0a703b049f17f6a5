package epp

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The three health services of the protocol, on the ext_proc listener:
// liveness always serves; readiness and the ext_proc service follow
// turnout's readiness (every instance active, no leader).
func TestEPP_HealthServices(t *testing.T) {
	for _, tc := range []struct {
		name  string
		yaml  string
		ready healthpb.HealthCheckResponse_ServingStatus
	}{
		{"ready", flowYAML, healthpb.HealthCheckResponse_SERVING},
		// Health checks on and no round run yet: /readyz says not ready.
		{"not ready", "deployments:\n  - name: d\n    models: [m]\n    pools: [{endpoints: [{name: a, address: 10.0.6.1:8000}]}]\n", healthpb.HealthCheckResponse_NOT_SERVING},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.yaml)
			c := healthpb.NewHealthClient(h.conn)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for svc, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
				HealthLiveness:  healthpb.HealthCheckResponse_SERVING,
				HealthReadiness: tc.ready,
				HealthExtProc:   tc.ready,
			} {
				r, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || r.GetStatus() != want {
					t.Errorf("%s: %v %v, want %v", svc, r.GetStatus(), err, want)
				}
			}
			if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
				t.Errorf("unknown service: %v, want NotFound", err)
			}
		})
	}
}
