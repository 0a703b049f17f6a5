package bench

import (
	"context"
	"fmt"
	"os"
)

// withStack starts fresh replicas, turnout (spec, with the deployment's
// extra lines) and the proxy in a new run directory, and calls run with
// the proxy's URL, bounded by o.Timeout.
func withStack(ctx context.Context, o E2EOptions, prefix string, spec PolicySpec, deployment []string, run func(ctx context.Context, url string) error) error {
	dir, err := os.MkdirTemp(o.WorkDir, prefix)
	if err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	if !o.Keep {
		defer os.RemoveAll(dir)
	}
	st, err := StartStack(ctx, StackOptions{
		Dir: dir, Spec: spec, ProxySetup: o.ProxySetup, Replicas: o.Sim.Replicas, Model: o.Sim.Model,
		MockArgs: ReplayMockArgs(o.Sim, o.TimeScale), Log: o.Log, DeploymentYAML: deployment,
	})
	if err != nil {
		return err
	}
	defer st.Stop()
	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	return run(rctx, st.FrontURL)
}
