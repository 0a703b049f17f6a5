package bench

import (
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/turnout/turnout/route/policy"
)

// ClassSheddable is the SLO benchmark's second class.
const ClassSheddable = "sheddable"

// SLOOptions configure `turnout-lab bench slo`: a trace replayed in the
// sim with a critical and a sheddable class, both with a TTFT objective,
// once per setup and seed (the seed picks which requests are critical).
type SLOOptions struct {
	Sim SimOptions
	// CriticalShare is the fraction of requests sent as critical.
	CriticalShare float64
	// Objective is the critical class's ttft_slo, SheddableObjective the
	// sheddable class's (a tighter one sheds sooner and keeps the engine
	// queues shorter for critical requests).
	Objective, SheddableObjective time.Duration
	Seeds                         []uint64
}

// SLOSetup is one compared router.
type SLOSetup struct {
	Name string
	Spec PolicySpec
	// Flow are the deployment's flow_control lines (nil: off).
	Flow []string
}

// SLOSetups are round robin (the proxy alone), prefix-affinity and
// predicted-ttft without flow control, and predicted-ttft with flow
// control carrying the objective (SLO routing and admission). Flow
// control never holds here (max_load far above any load): the sim runs
// in virtual time, where a held request would hold the whole replay.
// timeScale is the replicas' (1 in the sim): turnout sees wall time, so
// its ttft_slo lines are the objectives scaled, the names unscaled.
func SLOSetups(objective, sheddable time.Duration, timeScale float64) []SLOSetup {
	obj := objective.String()
	scaled := func(d time.Duration) string { return time.Duration(float64(d) * timeScale).String() }
	flow := []string{
		"flow_control:",
		"  trust: {priority_header: true}",
		"  saturation: {max_load: 1000000}",
		"  default_class: " + ClassSheddable,
		"  classes:",
		"    - {name: " + ClassCritical + ", ttft_slo: " + scaled(objective) + "}",
		"    - {name: " + ClassSheddable + ", shed: true, ttft_slo: " + scaled(sheddable) + "}",
	}
	return []SLOSetup{
		{Name: HAProxyRoundRobin, Spec: PolicySpec{Policy: HAProxyRoundRobin}},
		{Name: policy.PrefixAffinityType, Spec: PolicySpec{Policy: policy.PrefixAffinityType}},
		{Name: policy.PredictedTTFTType, Spec: PolicySpec{Policy: policy.PredictedTTFTType}},
		{Name: policy.PredictedTTFTType + " + SLO (ttft_slo " + obj + ", sheddable " + sheddable.String() + ")", Spec: PolicySpec{Policy: policy.PredictedTTFTType}, Flow: flow},
	}
}

// SLORow is one setup replayed with one seed.
type SLORow struct {
	Setup string
	Seed  uint64
	// Critical and Sheddable: requests, met (TTFT within the objective),
	// shed (429).
	Critical, Sheddable SLOCount
	// CriticalTTFT and SheddableTTFT summarise the served requests' TTFT (ms).
	CriticalTTFT, SheddableTTFT Summary
	// Reachable is the share of critical requests that an idle replica
	// without a cache hit serves within the objective (a bound on what
	// routing alone can promise a miss).
	Reachable float64
	// Errors are requests that failed otherwise (e2e: counted as shed in
	// the class counts, so as not met).
	Errors int
}

// SLOCount is one class's requests and their outcomes.
type SLOCount struct{ N, Met, Shed int }

// Attainment is met / requests (shed ones count as not met).
func (c SLOCount) Attainment() float64 {
	if c.N == 0 {
		return 0
	}
	return float64(c.Met) / float64(c.N)
}

// AssignSLOClasses marks a share of requests critical, chosen by seed,
// the rest sheddable.
func AssignSLOClasses(reqs []Request, criticalShare float64, seed uint64) {
	for i := range reqs {
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%d", seed, reqs[i].Index)
		reqs[i].Class = ClassSheddable
		if float64(h.Sum64()%10000) < criticalShare*10000 {
			reqs[i].Class = ClassCritical
		}
	}
}

// RunSLO replays reqs for every seed and setup in the sim.
func RunSLO(reqs []Request, setups []SLOSetup, o SLOOptions) ([]SLORow, error) {
	var rows []SLORow
	names := ReplicaNames(o.Sim.Replicas)
	for _, seed := range o.Seeds {
		AssignSLOClasses(reqs, o.CriticalShare, seed)
		for _, s := range setups {
			so := o.Sim
			so.Seed = seed
			router, err := newSLORouter(s, names, so)
			if err != nil {
				return nil, err
			}
			res, err := Simulate(reqs, router, so)
			if c, ok := router.(io.Closer); ok {
				_ = c.Close()
			}
			if err != nil {
				return nil, fmt.Errorf("slo %s seed %d: %w", s.Name, seed, err)
			}
			rows = append(rows, sloRow(reqs, s.Name, seed, res, o, 1))
		}
	}
	return rows, nil
}

func newSLORouter(s SLOSetup, names []string, o SimOptions) (Router, error) {
	if s.Flow == nil {
		return NewRouter(s.Spec, names, o)
	}
	return newRouterWith(s.Spec, names, o, s.Flow)
}

// sloRow counts each class's outcomes; scale turns res's times into the
// trace's (1/time scale in e2e).
func sloRow(reqs []Request, setup string, seed uint64, res *RunResult, o SLOOptions, scale float64) SLORow {
	row := SLORow{Setup: setup, Seed: seed, Errors: res.Errors}
	var crit, shed []float64
	reach := 0
	for i := range reqs {
		r := &reqs[i]
		c, ttfts, obj := &row.Sheddable, &shed, o.SheddableObjective
		if r.Class == ClassCritical {
			obj = o.Objective
			c, ttfts = &row.Critical, &crit
			if o.Sim.Timing.TTFT(r.InputTokens+1) <= o.Objective {
				reach++
			}
		}
		c.N++
		d := time.Duration(-1)
		if r.Index < len(res.ByIndex) && res.ByIndex[r.Index] >= 0 {
			d = time.Duration(float64(res.ByIndex[r.Index]) * scale)
		}
		switch {
		case d < 0:
			c.Shed++
		default:
			*ttfts = append(*ttfts, float64(d)/float64(time.Millisecond))
			if d <= obj {
				c.Met++
			}
		}
	}
	row.CriticalTTFT, row.SheddableTTFT = Summarize(crit), Summarize(shed)
	if row.Critical.N > 0 {
		row.Reachable = float64(reach) / float64(row.Critical.N)
	}
	return row
}

// WriteSLOMarkdown writes one line per setup and seed, then each setup's
// mean over the seeds.
func WriteSLOMarkdown(w io.Writer, rows []SLORow) error {
	if _, err := fmt.Fprintln(w, "| setup | seed | critical attainment | critical TTFT p50/p90/p99 ms | sheddable attainment (shed) | sheddable TTFT p50/p99 ms | critical reachable on an idle miss |\n|---|---:|---:|---|---|---|---:|"); err != nil {
		return err
	}
	var order []string
	sum := map[string][3]float64{}
	for _, r := range rows {
		if !slices.Contains(order, r.Setup) {
			order = append(order, r.Setup)
		}
		s := sum[r.Setup]
		s[0] += r.Critical.Attainment()
		s[1] += r.Sheddable.Attainment()
		s[2]++
		sum[r.Setup] = s
		if _, err := fmt.Fprintf(w, "| %s | %d | %.1f%% (%d/%d) | %.0f/%.0f/%.0f | %.1f%% (%d) | %.0f/%.0f | %.1f%% |\n", r.Setup, r.Seed,
			100*r.Critical.Attainment(), r.Critical.Met, r.Critical.N, r.CriticalTTFT.P50, r.CriticalTTFT.P90, r.CriticalTTFT.P99,
			100*r.Sheddable.Attainment(), r.Sheddable.Shed, r.SheddableTTFT.P50, r.SheddableTTFT.P99, 100*r.Reachable); err != nil {
			return err
		}
	}
	for _, name := range order {
		s := sum[name]
		if _, err := fmt.Fprintf(w, "| **%s, mean** | %s | **%.1f%%** | | %.1f%% | | |\n", name, strconv.Itoa(int(s[2]))+" seeds", 100*s[0]/s[2], 100*s[1]/s[2]); err != nil {
			return err
		}
	}
	return nil
}
