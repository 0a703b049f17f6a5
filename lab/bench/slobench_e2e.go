package bench

import (
	"context"
	"fmt"
	"os"
)

// RunSLOE2E replays reqs for every seed and setup through real processes
// (fresh mock replicas, turnout and the proxy per row, as RunE2E): the
// same classes and objectives as RunSLO, each request's TTFT measured by
// the client from its scheduled arrival, a 429 counted as shed.
func RunSLOE2E(ctx context.Context, reqs []Request, o SLOOptions, e E2EOptions) ([]SLORow, error) {
	setups := SLOSetups(o.Objective, o.SheddableObjective, e.TimeScale)
	specs := make([]PolicySpec, len(setups))
	for i, s := range setups {
		specs[i] = s.Spec
	}
	if err := e.validate(specs); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(e.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("slo work dir: %w", err)
	}
	var rows []SLORow
	for _, seed := range o.Seeds {
		AssignSLOClasses(reqs, o.CriticalShare, seed)
		for _, s := range setups {
			var res *RunResult
			err := withStack(ctx, e, "slo-", s.Spec, s.Flow, func(ctx context.Context, url string) (err error) {
				res, err = Drive(ctx, reqs, DriveOptions{
					URL: url, Model: e.Sim.Model, Concurrency: e.Sim.Concurrency,
					Compress: e.Sim.Compress, TimeScale: e.TimeScale, Log: e.Log,
				})
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("slo e2e %s seed %d: %w", s.Name, seed, err)
			}
			row := sloRow(reqs, s.Name, seed, res, o, 1/e.TimeScale)
			e.Log.Info().Str("setup", s.Name).Uint64("seed", seed).Float64("critical", row.Critical.Attainment()).
				Int("shed", row.Sheddable.Shed).Int("errors", row.Errors).Msg("bench: slo e2e row")
			rows = append(rows, row)
		}
	}
	return rows, nil
}
