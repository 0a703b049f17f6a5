package contract

import (
	"slices"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

func TestForwardedHeaders(t *testing.T) {
	cfg := &config.Config{
		SessionHeaders: []string{"X-Session-Id"},
		ModelHeaders:   []string{"X-Model"},
		Deployments:    []config.DeploymentConfig{{Name: "a", Pools: []config.PoolConfig{{Role: config.RoleMixed}}}},
	}
	names := func() (n []string) {
		for _, h := range ForwardedHeaders(cfg) {
			n = append(n, h.Name+"@"+h.Field)
		}
		return n
	}
	want := []string{"X-Session-Id@session_headers[0]", "X-Model@model_headers[0]", "content-type@content-type", "x-request-id@x-request-id"}
	if got := names(); !slices.Equal(got, want) {
		t.Fatalf("aggregated: %v, want %v", got, want)
	}
	// A prefill/decode deployment anywhere adds the client's credentials.
	cfg.Deployments = append(cfg.Deployments, config.DeploymentConfig{Name: "pd", Pools: []config.PoolConfig{{Role: config.RolePrefill}, {Role: config.RoleDecode}}})
	if got := names(); !slices.Equal(got, append(want, "authorization@authorization")) {
		t.Fatalf("with PD: %v", got)
	}
}
