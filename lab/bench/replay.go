package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/policy"

	"github.com/rs/zerolog"
)

// RunSim replays reqs once per spec in the simulator and returns one row per
// spec. A policy that cannot be built in the sim (kv-aware needs replica KV
// events) gets a row with a Note instead of failing the whole run.
func RunSim(reqs []Request, trace string, specs []PolicySpec, o SimOptions) ([]Row, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := o.Log
	if log == nil {
		l := zerolog.Nop()
		log = &l
	}
	if o.LoRA.Adapters > 0 {
		reqs = WithAdapters(reqs, o.LoRA, o.Seed)
	}
	inf, pooled := CacheBounds(reqs, o.BlockSize, o.Replicas*o.CacheBlocks)
	names := ReplicaNames(o.Replicas)
	// One run per spec, or per spec and front count (--fronts).
	// A count's k-th repeat is round k, replayed with seed Seed+k*roundSeeds:
	// the rounds sample the placement's chance, which moves one replay's
	// TTFT p99 by 10 % (FrontsMeans).
	type run struct {
		spec   PolicySpec
		fronts int
		seed   uint64
	}
	var runs []run
	for _, sp := range specs {
		if len(o.Fronts) == 0 {
			runs = append(runs, run{spec: sp, seed: o.Seed})
		}
		round := map[int]uint64{}
		for _, n := range o.Fronts {
			runs = append(runs, run{spec: sp, fronts: n, seed: o.Seed + round[n]*roundSeeds})
			round[n]++
		}
	}
	rows := make([]Row, len(runs))
	errs := make([]error, len(runs))
	// Runs are independent (own router, own replicas; reqs is read-only), so
	// they spread over Parallel workers.
	work := make(chan int)
	var wg sync.WaitGroup
	for range max(o.Parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ro := o
				ro.Seed = runs[i].seed
				rows[i], errs[i] = simRow(reqs, trace, runs[i].spec, runs[i].fronts, names, ro, inf, pooled, log)
			}
		}()
	}
	for i := range runs {
		work <- i
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rows, nil
}

// roundSeeds spaces the seeds of --fronts rounds: front f of a round uses
// the round's seed + f (at most maxFronts), so rounds never share one.
const roundSeeds = 1000

func simRow(reqs []Request, trace string, spec PolicySpec, fronts int, names []string, o SimOptions, inf, pooled float64, log *zerolog.Logger) (Row, error) {
	start := time.Now()
	var router Router
	var err error
	if fronts > 0 {
		if spec.IsProxyAlone() {
			return Row{Mode: "sim", Trace: trace, Policy: spec.String(), Fronts: fronts, Note: "skipped: --fronts needs a turnout policy"}, nil
		}
		// The sync's cost is read from this thread's CPU clock.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		router, err = newFrontsRouter(spec, names, o, fronts, FrontOf(reqs, fronts, o.Split, o.Seed))
	} else {
		router, err = NewRouter(spec, names, o)
	}
	if err != nil {
		if errors.Is(err, config.ErrConfig) && !isCorePolicy(spec.Policy) {
			log.Warn().Err(err).Str("policy", spec.String()).Msg("bench: policy skipped")
			return Row{Mode: "sim", Trace: trace, Policy: spec.String(), Note: "skipped: " + err.Error()}, nil
		}
		return Row{}, err
	}
	if c, ok := router.(io.Closer); ok {
		defer func() {
			if err := c.Close(); err != nil {
				log.Warn().Err(err).Str("policy", spec.String()).Msg("bench: router close")
			}
		}()
	}
	res, err := Simulate(reqs, router, o)
	if err != nil {
		return Row{}, fmt.Errorf("sim %s: %w", spec, err)
	}
	row := MakeRow("sim", trace, spec, res, inf, pooled, 1)
	row.Fronts = fronts
	if fr, ok := router.(*frontsRouter); ok && res.Requests > 0 {
		msgs, bytes, cost := fr.SyncCost()
		d := float64(res.Requests)
		row.SyncMsgs, row.SyncBytes = float64(msgs)/d, float64(bytes)/d
		row.SyncUs = float64(cost.Nanoseconds()) / 1e3 / d / float64(fronts)
	}
	if o.LoRA.Adapters > 0 {
		row.Adapters, row.AdapterLoads = true, res.AdapterLoads
	}
	row.Wall = time.Since(start)
	if d, ok := router.(interface{ Detail() string }); ok {
		row.Detail = d.Detail()
	}
	if res.SessionRepeats > 0 {
		row.Detail = strings.TrimSpace(fmt.Sprintf("%s session_moves=%d/%d", row.Detail, res.SessionMoves, res.SessionRepeats))
	}
	log.Info().Str("policy", row.Policy).Int("requests", row.Requests).Float64("hit", row.HitRatio).
		Float64("load", row.LoadReq).Float64("ttft_p50_ms", row.TTFT.P50).Dur("wall", row.Wall).Msg("bench: sim row")
	return row, nil
}

// isCorePolicy reports whether a policy must always work in the sim.
func isCorePolicy(name string) bool {
	switch name {
	case policy.RoundRobinType, policy.LeastRequestType, policy.SessionHashType, policy.PrefixAffinityType, HAProxyRoundRobin, HAProxyLeastConn, NginxRoundRobin, NginxLeastConn:
		return true
	}
	return false
}

// QuickSweep varies prefix-affinity's parameters around the axes that
// matter on long-prompt traces: the router's index capacity (how long it
// remembers what a replica holds), the block size (decision cost), and, at
// a large index, the balance guard and match threshold that trade hit ratio
// against balance; plus session-hash's load factor. About 15 runs.
func QuickSweep() []PolicySpec {
	pa := policy.PrefixAffinityType
	var out []PolicySpec
	add := func(policy string, kv ...string) {
		ps := PolicySpec{Policy: policy}
		for i := 0; i+1 < len(kv); i += 2 {
			ps.Params = append(ps.Params, Param{kv[i], kv[i+1]})
		}
		out = append(out, ps)
	}
	for _, v := range []string{"16384", "262144", "1048576"} {
		add(pa, "capacity_blocks", v)
	}
	add(pa, "block_bytes", "512", "capacity_blocks", "262144")
	const big = "1048576"
	for _, v := range []string{"2", "4", "16"} {
		add(pa, "capacity_blocks", big, "balance_abs", v)
	}
	for _, v := range []string{"1.1", "1.25", "2"} {
		add(pa, "capacity_blocks", big, "balance_rel", v)
	}
	add(pa, "capacity_blocks", big, "balance_abs", "4", "balance_rel", "1.25")
	for _, v := range []string{"0.1", "0.6"} {
		add(pa, "capacity_blocks", big, "match_threshold", v)
	}
	// Session stickiness on a miss, off (prefix matching alone).
	add(pa, "session_affinity", "false")
	add(pa, "capacity_blocks", big, "session_affinity", "false")
	add(pa, "capacity_blocks", big, "balance_abs", "2", "session_affinity", "false")
	for _, v := range []string{"1.1", "1.25", "2"} {
		add(policy.SessionHashType, "load_factor", v)
	}
	return out
}

// FullSweep is the prefix-affinity grid (capacity x threshold x balance).
func FullSweep() []PolicySpec {
	var out []PolicySpec
	for _, capb := range []string{"65536", "262144", "1048576"} {
		for _, th := range []string{"0.1", "0.3", "0.6"} {
			for _, ab := range []string{"2", "4", "8", "16"} {
				for _, rel := range []string{"1.1", "1.25", "1.5", "2"} {
					out = append(out, PolicySpec{Policy: policy.PrefixAffinityType, Params: []Param{
						{"capacity_blocks", capb}, {"match_threshold", th}, {"balance_abs", ab}, {"balance_rel", rel},
					}})
				}
			}
		}
	}
	return out
}

// Outputs writes a set of rows as NAME.txt, NAME.csv, NAME.md and
// (with a chart title) NAME.svg into dir.
func Outputs(dir, name string, rows, sweep []Row, chart *ChartOptions) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	all := append(append([]Row(nil), rows...), sweep...)
	errs := []error{
		writeFile(dir, name+".txt", func(w io.Writer) error { return WriteTable(w, all) }),
		writeFile(dir, name+".csv", func(w io.Writer) error { return WriteCSV(w, all) }),
		writeFile(dir, name+".md", func(w io.Writer) error { return WriteMarkdown(w, all) }),
	}
	if chart != nil {
		errs = append(errs, writeFile(dir, name+".svg", func(w io.Writer) error { return WriteSVG(w, rows, sweep, *chart) }))
	}
	return errors.Join(errs...)
}

// writeFile creates dir/name and writes it with fn.
func writeFile(dir, name string, fn func(io.Writer) error) error {
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		return fmt.Errorf("create %s: %w", p, err)
	}
	if err := fn(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", p, err)
	}
	return nil
}
