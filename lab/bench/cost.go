package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/rs/zerolog"
)

// CostOptions configure the cost benchmark.
type CostOptions struct {
	Turnout string // turnout binary (serve, render)
	Lab     string // turnout-lab binary (mock replicas, the trivial handler)
	HAProxy string // haproxy binary ("" skips the HAProxy rows; missing: a note)
	// Nginx is the nginx binary ("" skips the nginx rows; missing: a note).
	Nginx string
	// NginxModule is the njs module the body-mode row needs (default
	// nginx.DefaultModulePath; missing: that row is a note).
	NginxModule string
	Wrk         string // wrk binary ("" = the Go load generator)
	// Duration of one load run; every target gets Rounds runs, interleaved,
	// so a noisy neighbour hurts all targets alike.
	Duration time.Duration
	Rounds   int
	Conns    int
	// WrkThreads is wrk's -t (keep it low: wrk shares the cores).
	WrkThreads int
	Replicas   int
	// Policies are measured on /internal/route alone.
	Policies []string
	// ProxyPolicy is turnout's policy behind HAProxy and behind nginx in
	// body mode (njs sends turnout the body).
	ProxyPolicy string
	// NginxHeaderPolicy is turnout's policy behind nginx in header mode
	// (auth_request): turnout sees headers only, so a prefix policy would
	// have nothing to match; session-hash is what header mode is for.
	NginxHeaderPolicy string
	// SSEProbes is how many sequential streaming requests per stack measure
	// the first-chunk delay.
	SSEProbes int
	// LargeBody is the size of the large-body rows' chat bodies (0: none).
	LargeBody int
	// LatencyDuration is the length of the 1-connection runs that measure
	// the added latency at light load (0: none).
	LatencyDuration time.Duration
	// IdleConns is how many idle keep-alive connections the HAProxy memory
	// rows hold open (0: none).
	IdleConns int
	// HAProxyNbthread adds plain HAProxy and the default SPOE render with
	// this nbthread (0: none): HAProxy's default takes every CPU, which on
	// a box it shares with turnout and the load is not its best.
	HAProxyNbthread int
	// HAProxyEnv (VAR=VALUE entries) adds plain HAProxy and the default
	// SPOE render started with them in HAProxy's environment (none: no
	// such rows).
	HAProxyEnv []string
	// RouteBodies add the default SPOE render with each route_body, and
	// plain HAProxy at each of their tune.bufsize and at the default
	// render's (none: no such rows).
	RouteBodies []int
	// Perf is the perf binary that counts the proxy's system calls, page
	// faults and context switches during each run ("": not counted).
	Perf string
	Dir  string
	Log  *zerolog.Logger
}

// CostRow is one target of the cost benchmark.
type CostRow struct {
	// Group is route, haproxy, nginx, haproxy-sse or nginx-sse; the first
	// row of a group is the baseline its other rows are compared with.
	Group    string
	Target   string
	LoadGen  string
	Conns    int
	Requests int
	Errors   int
	RPS      float64
	P50, P99 float64 // ms
	// Ratio is the median over rounds of RPS / the baseline's RPS in the
	// same round; Added* are latency differences to the baseline, in ms.
	Ratio              float64
	AddedP50, AddedP99 float64
	Baseline           bool
	// Probe marks the sequential first-chunk rows: latency only, no rps.
	Probe bool
	// ProxyRSS is the proxy's resident memory (master and workers, MiB):
	// the median over rounds of each run's peak, or with IdleConns idle
	// connections open for the idle rows. TurnoutRSS is turnout's.
	ProxyRSS, TurnoutRSS float64
	// RSSRatio is ProxyRSS against the group baseline's.
	RSSRatio float64
	// ProxyCPU and TurnoutCPU are CPU time (user + system, /proc/PID/stat)
	// per request in µs, the median over rounds: steadier than req/s on a
	// busy box, where the neighbours take wall time but not this CPU.
	ProxyCPU, TurnoutCPU float64
	// ProxySyscalls, ProxyFaults and ProxyCtxSwitches are the proxy's
	// system calls, page faults and context switches per request (perf
	// stat, CostOptions.Perf; median of rounds; 0: not counted).
	ProxySyscalls, ProxyFaults, ProxyCtxSwitches float64
	// Idle marks the idle keep-alive memory rows; IdleBefore is the proxy's
	// RSS before the connections were opened.
	Idle       bool
	IdleBefore float64
	Note       string
	// bestOf marks a plain configuration of the group: each round's
	// baseline is the best of these rows (the proxy at its best).
	bestOf               bool
	roundRPS             []float64
	roundP50s, roundP99s []float64
	roundProxyRSS        []float64
	roundTurnoutRSS      []float64
	roundProxyCPU        []float64
	roundTurnoutCPU      []float64
	roundProxyPerf       []perfCounts
}

// RunCost measures /internal/route against a trivial handler, then the
// proxies in front of the same mock replicas, all in one interleaved set of
// rounds: plain HAProxy against HAProxy + Lua + turnout, and plain nginx
// against nginx + turnout in header mode (auth_request) and in body mode
// (njs); then the SSE first-chunk delay through each of them.
func RunCost(ctx context.Context, o CostOptions) ([]CostRow, error) {
	if o.Log == nil {
		l := zerolog.Nop()
		o.Log = &l
	}
	if o.Rounds < 1 || o.Conns < 1 || o.Duration <= 0 {
		return nil, errors.New("cost: rounds, conns and duration must be positive")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cost dir: %w", err)
	}
	rows, err := costRoute(ctx, o)
	if err != nil {
		return nil, err
	}
	prows, err := costProxy(ctx, o)
	if err != nil {
		return nil, err
	}
	return append(rows, prows...), nil
}

func (o *CostOptions) loadGenName() string {
	if o.Wrk != "" {
		return "wrk -t" + strconv.Itoa(o.WrkThreads)
	}
	return "go"
}

// costTarget is a load target and the group whose baseline it is compared
// with, with its own load shape: bodies, connections, run length.
type costTarget struct {
	Group string
	LoadTarget
	Bodies   []CostBody
	Conns    int
	Duration time.Duration
	// ProxyPIDs and TurnoutPIDs are sampled for memory during each run.
	ProxyPIDs, TurnoutPIDs []int
	// BestOf: a plain configuration, candidate for the group's baseline
	// (CostRow.bestOf).
	BestOf bool
}

// runRounds loads each target Rounds times, interleaved (every round runs
// every target once, in order), and fills rows.
func runRounds(ctx context.Context, o CostOptions, targets []costTarget) ([]CostRow, error) {
	rows := make([]CostRow, len(targets))
	lats := make([][]time.Duration, len(targets))
	scripts := make([]string, len(targets))
	for i, t := range targets {
		rows[i] = CostRow{Group: t.Group, Target: t.Name, LoadGen: o.loadGenName(), Conns: t.Conns, bestOf: t.BestOf}
		if o.Wrk != "" {
			p, err := writeWrkScript(o.Dir, t.Group, t.LoadTarget, t.Bodies)
			if err != nil {
				return nil, err
			}
			scripts[i] = p
		}
	}
	var elapsed = make([]time.Duration, len(targets))
	for r := range o.Rounds {
		for i, t := range targets {
			var (
				res *LoadResult
				err error
			)
			prss, trss := sampleRSS(t.ProxyPIDs, 100*time.Millisecond), sampleRSS(t.TurnoutPIDs, 100*time.Millisecond)
			var perf *perfStat
			if o.Perf != "" && len(t.ProxyPIDs) > 0 {
				if perf, err = startPerfStat(o.Perf, o.Dir, t.ProxyPIDs); err != nil {
					prss.Stop()
					trss.Stop()
					return nil, fmt.Errorf("cost %s: %w", t.Name, err)
				}
			}
			pcpu, tcpu := cpuOf(t.ProxyPIDs), cpuOf(t.TurnoutPIDs)
			if o.Wrk != "" {
				res, err = WrkLoad(ctx, o.Wrk, scripts[i], t.LoadTarget, o.WrkThreads, t.Conns, t.Duration)
			} else {
				res, err = GoLoad(ctx, t.LoadTarget, t.Bodies, t.Conns, t.Duration)
			}
			pm, tm := prss.Stop(), trss.Stop()
			pcpu, tcpu = cpuOf(t.ProxyPIDs)-pcpu, cpuOf(t.TurnoutPIDs)-tcpu
			var pc perfCounts
			if perf != nil {
				var perr error
				pc, perr = perf.stop()
				err = errors.Join(err, perr)
			}
			if err != nil {
				return nil, err
			}
			if res.FirstErr != nil {
				o.Log.Warn().Err(res.FirstErr).Str("target", t.Name).Int("errors", res.Errors).Msg("bench cost: request errors")
			}
			row := &rows[i]
			row.Requests += res.Requests
			row.Errors += res.Errors
			elapsed[i] += res.Elapsed
			lats[i] = append(lats[i], res.Latencies...)
			row.roundRPS = append(row.roundRPS, res.RPS())
			row.roundP50s = append(row.roundP50s, float64(res.P50)/float64(time.Millisecond))
			row.roundP99s = append(row.roundP99s, float64(res.P99)/float64(time.Millisecond))
			row.roundProxyRSS = append(row.roundProxyRSS, pm)
			row.roundTurnoutRSS = append(row.roundTurnoutRSS, tm)
			var pus, tus float64
			if res.Requests > 0 {
				pus, tus = perRequestUs(pcpu, res.Requests), perRequestUs(tcpu, res.Requests)
				row.roundProxyCPU = append(row.roundProxyCPU, pus)
				row.roundTurnoutCPU = append(row.roundTurnoutCPU, tus)
				if perf != nil {
					n := float64(res.Requests)
					row.roundProxyPerf = append(row.roundProxyPerf, perfCounts{pc.Syscalls / n, pc.Faults / n, pc.CtxSwitches / n})
				}
			}
			o.Log.Info().Str("group", t.Group).Str("target", t.Name).Int("round", r+1).Float64("rps", res.RPS()).
				Dur("p50", res.P50).Dur("p99", res.P99).Int("errors", res.Errors).Float64("proxy_rss_mib", pm).
				Float64("proxy_cpu_us", pus).Float64("turnout_cpu_us", tus).Msg("bench cost: run")
		}
	}
	for i := range rows {
		row := &rows[i]
		if elapsed[i] > 0 {
			row.RPS = float64(row.Requests) / elapsed[i].Seconds()
		}
		if len(lats[i]) > 0 {
			s := Summarize(Millis(lats[i]))
			row.P50, row.P99 = s.P50, s.P99
		} else {
			// wrk gives percentiles per run only: take the median run's.
			row.P50, row.P99 = median(row.roundP50s), median(row.roundP99s)
		}
		row.ProxyRSS, row.TurnoutRSS = median(row.roundProxyRSS), median(row.roundTurnoutRSS)
		row.ProxyCPU, row.TurnoutCPU = median(row.roundProxyCPU), median(row.roundTurnoutCPU)
		if len(row.roundProxyPerf) > 0 {
			row.ProxySyscalls = median(perfField(row.roundProxyPerf, func(c perfCounts) float64 { return c.Syscalls }))
			row.ProxyFaults = median(perfField(row.roundProxyPerf, func(c perfCounts) float64 { return c.Faults }))
			row.ProxyCtxSwitches = median(perfField(row.roundProxyPerf, func(c perfCounts) float64 { return c.CtxSwitches }))
		}
	}
	applyGroupBaselines(rows)
	return rows, nil
}

// cpuOf is the CPU time the processes used so far (0 for one that is gone).
func cpuOf(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		if c, err := procCPU(p); err == nil {
			sum += c
		}
	}
	return sum
}

func perRequestUs(cpu time.Duration, requests int) float64 {
	return float64(cpu) / float64(time.Microsecond) / float64(requests)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return Percentile(s, 50)
}

// applyGroupBaselines compares every row with the first row of its group
// (marked Baseline), wherever the group's rows sit: Added* are the latency
// differences in ms, and Ratio is the median of the per-round rps ratios
// when both rows have rounds (else the ratio of the totals). Rounds run the
// targets back to back, so a round's ratio compares like with like; the
// median of those resists a noisy neighbour better than the ratio of totals.
// When a group has rows marked bestOf (the plain proxy in several
// configurations), a round's baseline rps is the best of them: the ratio is
// to the proxy at its best in that round.
func applyGroupBaselines(rows []CostRow) {
	base := map[string]int{}
	best := map[string][]float64{}
	for i := range rows {
		g := rows[i].Group
		if _, ok := base[g]; !ok {
			base[g] = i
		}
		if !rows[i].bestOf {
			continue
		}
		for k, v := range rows[i].roundRPS {
			if k == len(best[g]) {
				best[g] = append(best[g], v)
			}
			best[g][k] = max(best[g][k], v)
		}
	}
	for i := range rows {
		b := base[rows[i].Group]
		r, br := &rows[i], &rows[b]
		r.Baseline = i == b
		r.AddedP50 = r.P50 - br.P50
		r.AddedP99 = r.P99 - br.P99
		r.RSSRatio = Ratio(r.ProxyRSS, br.ProxyRSS)
		baseRounds := br.roundRPS
		if bs, ok := best[r.Group]; ok {
			baseRounds = bs
		}
		n := min(len(r.roundRPS), len(baseRounds))
		if n == 0 {
			r.Ratio = Ratio(r.RPS, br.RPS)
			continue
		}
		rs := make([]float64, n)
		for k := range n {
			rs[k] = Ratio(r.roundRPS[k], baseRounds[k])
		}
		r.Ratio = median(rs)
	}
}

// CheckCost fails when a throughput row did no work or errors dominate (smoke).
func CheckCost(rows []CostRow) error {
	var errs []error
	for _, r := range rows {
		if r.Note != "" {
			continue
		}
		if r.Requests == 0 || r.Errors > r.Requests/10 {
			errs = append(errs, fmt.Errorf("cost %s %s: %d requests, %d errors", r.Group, r.Target, r.Requests, r.Errors))
		}
	}
	return errors.Join(errs...)
}

// CostOutputs writes NAME.{txt,csv,md} into dir.
func CostOutputs(dir, name string, rows []CostRow) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	var errs []error
	for ext, fn := range map[string]func(io.Writer, []CostRow) error{".txt": WriteCostTable, ".csv": WriteCostCSV, ".md": WriteCostMarkdown} {
		errs = append(errs, writeFile(dir, name+ext, func(w io.Writer) error { return fn(w, rows) }))
	}
	return errors.Join(errs...)
}
