package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/lab/bench"
)

// runSLO is `bench slo`: SLO attainment per class in the sim, round robin
// and prefix-affinity against predicted-ttft with flow control's objective.
func runSLO(args []string, log *zerolog.Logger) error {
	d := bench.DefaultSimOptions()
	fset := cli.NewFlags("bench slo")
	trace := fset.String("trace", defaultMooncake, `trace file (.jsonl Mooncake, .csv Azure) or "synthetic"`)
	limit := fset.Int("limit", 0, "replay only the first N requests (0 = all)")
	share := fset.Float64("critical-share", 0.2, "fraction of requests sent as critical (the rest sheddable)")
	objective := fset.Duration("objective", time.Second, "the critical class's ttft_slo")
	sheddable := fset.Duration("sheddable-objective", time.Second, "the sheddable class's ttft_slo (below --objective: shed sooner, shorter engine queues for critical)")
	seeds := fset.String("seeds", "1,2,3", "comma-separated seeds (each picks which requests are critical)")
	out := fset.String("out", "bench-out", "output directory")
	name := fset.String("name", "", "output file name prefix (default: slo-TRACE)")
	o := d
	simReplicaFlags(fset, &o, d)
	mode := fset.String("mode", "sim", "sim (in-process, virtual time) or e2e (HAProxy + turnout + mock replicas, fresh per row)")
	e2e := defaultE2EFlags(fset)
	load := fset.Float64("load", 0, "instead of --compress: offered load as a multiple of the replicas' estimated capacity (replicas x max-running / mean service time, as bench flow)")
	if err := cli.ParseFlags(fset, benchSLOCmd, args); err != nil {
		return err
	}
	var ss []uint64
	for _, f := range strings.Split(*seeds, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("bench slo: --seeds %q: want unsigned integers", *seeds)
		}
		ss = append(ss, v)
	}
	if *objective <= 0 || *sheddable <= 0 || *share <= 0 || *share > 1 {
		return errors.New("bench slo: --objective and --sheddable-objective must be > 0 and --critical-share in (0, 1]")
	}
	reqs, label, err := loadTrace(*trace, bench.TraceOptions{Limit: *limit, SessionBlocks: 1})
	if skipMissingTrace(err, *trace, "", log) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bench slo: %w", err)
	}
	if *name == "" {
		*name = "slo-" + label
	}
	if *load > 0 {
		o.Compress = bench.CompressFor(reqs, o, *load)
	}
	log.Info().Str("trace", label).Int("requests", len(reqs)).Float64("compress", o.Compress).Msg("bench: slo")
	so := bench.SLOOptions{Sim: o, CriticalShare: *share, Objective: *objective, SheddableObjective: *sheddable, Seeds: ss}
	run := func(context.Context) ([]bench.SLORow, error) {
		return bench.RunSLO(reqs, bench.SLOSetups(*objective, *sheddable, 1), so)
	}
	switch *mode {
	case "sim":
	case "e2e":
		*name += "-e2e"
		run = func(ctx context.Context) ([]bench.SLORow, error) {
			eo := e2e.options(o)
			done, err := e2e.prepare(&eo, log)
			if err != nil {
				return nil, err
			}
			defer done()
			return bench.RunSLOE2E(ctx, reqs, so, eo)
		}
	default:
		return fmt.Errorf("bench slo: --mode %q: want sim or e2e", *mode)
	}
	_, err = runTable(*out, *name+".md", run, bench.WriteSLOMarkdown)
	if err != nil {
		return fmt.Errorf("bench slo: %w", err)
	}
	return nil
}

// runFlow implements `turnout-lab bench flow`.
func runFlow(args []string, log *zerolog.Logger) error {
	d := bench.DefaultSimOptions()
	fset := cli.NewFlags("bench flow")
	trace := fset.String("trace", defaultMooncake, `trace file (.jsonl Mooncake, .csv Azure) or "synthetic"`)
	limit := fset.Int("limit", 400, "replay only the first N requests (0 = all)")
	loads := fset.String("loads", "1.2,1.5", "offered loads as multiples of the replicas' estimated capacity (replicas x max-running / mean service time)")
	share := fset.Float64("critical-share", 0.1, "fraction of requests sent as critical (the rest standard)")
	tenants := fset.Int("tenants", 4, "tenants the sessions are spread over (X-Tenant-Id)")
	out := fset.String("out", "bench-out", "output directory")
	name := fset.String("name", "", "output file name prefix (default: flow-TRACE)")
	o := d
	o.Replicas, o.MaxRunning = 4, 8
	fset.IntVar(&o.Replicas, "replicas", o.Replicas, "number of replicas")
	fset.IntVar(&o.MaxRunning, "max-running", o.MaxRunning, "running sequences per replica (the rest wait in the engine)")
	fset.DurationVar(&o.Timing.TTFTOverhead, "ttft-overhead", d.Timing.TTFTOverhead, "replica TTFT overhead")
	fset.DurationVar(&o.Timing.PerTokenPrefill, "per-token-prefill", d.Timing.PerTokenPrefill, "replica prefill time per uncached token")
	fset.DurationVar(&o.Timing.InterTokenLatency, "itl", d.Timing.InterTokenLatency, "replica inter-token latency")
	e2e := defaultE2EFlags(fset)
	if err := cli.ParseFlags(fset, benchFlowCmd, args); err != nil {
		return err
	}
	var ls []float64
	for _, f := range strings.Split(*loads, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return fmt.Errorf("bench flow: --loads %q: want positive numbers", *loads)
		}
		ls = append(ls, v)
	}
	reqs, label, err := loadTrace(*trace, bench.TraceOptions{Limit: *limit, SessionBlocks: 1})
	if skipMissingTrace(err, *trace, "", log) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bench flow: %w", err)
	}
	eo := e2e.options(o)
	done, err := e2e.prepare(&eo, log)
	if err != nil {
		return fmt.Errorf("bench flow: %w", err)
	}
	defer done()
	log.Info().Str("trace", label).Int("requests", len(reqs)).Dur("mean_service", bench.MeanService(reqs, o)).Msg("bench: flow")
	if *name == "" {
		*name = "flow-" + label
	}
	_, err = runTable(*out, *name+".md", func(ctx context.Context) ([]bench.FlowRow, error) {
		return bench.RunFlow(ctx, reqs, bench.FlowSetups(o.MaxRunning, e2e.proxy), bench.FlowOptions{E2E: eo, Loads: ls, CriticalShare: *share, Tenants: *tenants})
	}, bench.WriteFlowMarkdown)
	if err != nil {
		return fmt.Errorf("bench flow: %w", err)
	}
	return nil
}
