package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/lab/bench"
)

var benchScaleCmd = cli.Command{
	Prog:     prog,
	Synopsis: "turnout-lab bench scale [--policies LIST] [--endpoints LIST] [--prompt-kib LIST] [--blocks LIST] [flags]",
	About: `Measures the decision core in process, on one goroutine: decisions/s per core, p50/p99 decision time and
allocations for each policy at each pool size and prompt size, and for the prefix-keyed policies with the index
filled to each --blocks size first (its heap per indexed block). docs/scale.md reads these rows.`,
	Example: "turnout-lab bench scale --policies prefix-affinity --endpoints 64,256,1024 --prompt-kib 8 --blocks 0,1000000",
}

func runScale(args []string, log *zerolog.Logger) error {
	d := bench.DefaultScaleOptions()
	fset := cli.NewFlags("bench scale")
	pols := fset.String("policies", strings.Join(d.Policies, ","), "comma-separated turnout policies")
	eps := fset.String("endpoints", ints(d.Endpoints), "comma-separated pool sizes")
	kib := fset.String("prompt-kib", ints(d.PromptKiB), "comma-separated prompt sizes in KiB")
	blocks := fset.String("blocks", ints(d.Blocks), "comma-separated prefix index sizes filled before timing (prefix-keyed policies)")
	fset.IntVar(&d.Decisions, "decisions", d.Decisions, "timed decisions per cell")
	fset.IntVar(&d.Open, "open", d.Open, "decisions kept open per endpoint while timing")
	fset.Uint64Var(&d.Seed, "seed", d.Seed, "seed for the policies")
	out := fset.String("out", "bench-out", "output directory")
	name := fset.String("name", "scale", "output file name prefix")
	if err := cli.ParseFlags(fset, benchScaleCmd, args); err != nil {
		return err
	}
	var err error
	d.Policies = strings.Split(*pols, ",")
	if d.Endpoints, err = parseInts(*eps); err != nil {
		return fmt.Errorf("bench scale: --endpoints: %w", err)
	}
	if d.PromptKiB, err = parseInts(*kib); err != nil {
		return fmt.Errorf("bench scale: --prompt-kib: %w", err)
	}
	if d.Blocks, err = parseInts(*blocks); err != nil {
		return fmt.Errorf("bench scale: --blocks: %w", err)
	}
	d.Log = log
	_, err = runTable(*out, *name+".txt", func(ctx context.Context) ([]bench.ScaleRow, error) { return bench.RunScale(ctx, d) }, bench.WriteScaleTable)
	if err != nil {
		return fmt.Errorf("bench scale: %w", err)
	}
	return nil
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
