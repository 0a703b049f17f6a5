package main

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/lab/bench"
)

var benchTransportsCmd = cli.Command{
	Prog:     prog,
	Synopsis: "turnout-lab bench transports [--duration D] [--rounds N] [--conns N] [flags]",
	About: `Measures decisions/s and turnout's CPU per decision through each transport, same bodies, same run: /internal/route,
the SPOE agent and the Endpoint Picker (ext_proc, FULL_DUPLEX_STREAMED, h2c and TLS), each driven directly by its own client.
The HTTP and SPOE clients close each decision over the feedback path as the proxies do; a trivial fasthttp server's row,
started like turnout, is the floor any fasthttp server pays.`,
	Example: "turnout-lab bench transports --duration 3s --rounds 5",
}

func runTransports(args []string, log *zerolog.Logger) error {
	fset := cli.NewFlags("bench transports")
	o := bench.TransportOptions{Log: log}
	fset.DurationVar(&o.Duration, "duration", 3*time.Second, "length of one load run")
	fset.IntVar(&o.Rounds, "rounds", 5, "load runs per transport, interleaved across transports")
	fset.IntVar(&o.Conns, "conns", 16, "concurrent clients (connections for HTTP and SPOE, streams for ext_proc)")
	fset.IntVar(&o.GRPCConns, "grpc-conns", 2, "gRPC connections carrying the ext_proc streams (Envoy: one per worker thread)")
	fset.IntVar(&o.Replicas, "replicas", 4, "replicas in the pool (never called)")
	fset.StringVar(&o.Policy, "policy", "prefix-affinity", "turnout policy")
	fset.IntVar(&o.PromptKiB, "prompt-kib", 0, "every body's size in KiB (0: half 2 KiB, half 8 KiB)")
	fset.Float64Var(&o.Paced, "paced", 0, "after the rounds, run each transport once at this fraction of its decisions per core (0.5: half), for its latency at that load")
	fset.StringVar(&o.TurnoutCPUs, "turnout-cpus", "", "run turnout on these CPUs only (taskset list, e.g. 1); start the bench itself on the others (taskset -c 0 turnout-lab bench transports ...)")
	fset.IntVar(&o.Open, "open", 0, "decisions each HTTP and SPOE client keeps open before closing its oldest over the feedback path (0: each closed once answered; -1: never closed)")
	fset.StringVar(&o.Pacer, "pacer", "", "the paced HTTP rows' sender: spin (one goroutine that never sleeps; needs the bench's own CPU), fifo (the same loop on a SCHED_FIFO thread that sleeps until its next send or answer; root) or timer (Go timers, millisecond-grained); default spin with --turnout-cpus, else timer")
	fset.IntVar(&o.FIFO, "turnout-fifo", 0, "run the turnout and trivial processes under SCHED_FIFO at this priority (chrt -f; root), so other tasks' time slices do not delay them (0: the default scheduler)")
	fset.IntVar(&o.GOMAXPROCS, "turnout-gomaxprocs", 0, "GOMAXPROCS of the turnout and trivial processes (0: their runtime's default, the CPUs they may run on)")
	trivial := fset.Bool("trivial", true, "add the trivial fasthttp handler's row (turnout-lab bench trivial, pinned like turnout): the floor any fasthttp server pays")
	bin := fset.String("turnout-bin", "", "turnout binary (default: turnout next to this executable, else on $PATH)")
	fset.StringVar(&o.Baseline, "baseline-bin", "", "another turnout binary measured in the same run, interleaved (a row of its own for each transport)")
	fset.StringVar(&o.EPPServer, "epp-server", "", "epp.server of turnout-bin (default: its own default)")
	fset.StringVar(&o.BaselineEPPServer, "baseline-epp-server", "", "epp.server of baseline-bin (default: its own default)")
	out := fset.String("out", "bench-out", "output directory")
	name := fset.String("name", "transports", "output file name prefix")
	check := fset.Bool("check", false, "fail unless every transport answered with few errors (smoke)")
	if err := cli.ParseFlags(fset, benchTransportsCmd, args); err != nil {
		return err
	}
	var err error
	var lab string
	if o.Turnout, lab, err = binaries(*bin); err != nil {
		return fmt.Errorf("bench transports: %w", err)
	}
	if *trivial {
		o.Lab = lab
	}
	if o.Pacer == "" {
		o.Pacer = bench.PacerTimer
		if o.TurnoutCPUs != "" {
			o.Pacer = bench.PacerSpin
		}
	}
	work, done, err := workDir("turnout-transports-", false, log)
	if err != nil {
		return fmt.Errorf("bench transports: %w", err)
	}
	defer done()
	o.Dir = work
	rows, err := runTable(*out, *name+".txt", func(ctx context.Context) ([]bench.TransportRow, error) { return bench.RunTransports(ctx, o) }, bench.WriteTransportTable)
	if err != nil {
		return fmt.Errorf("bench transports: %w", err)
	}
	if *check {
		if err := bench.CheckTransports(rows); err != nil {
			return fmt.Errorf("bench transports check: %w", err)
		}
	}
	return nil
}
