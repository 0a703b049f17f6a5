//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// Issue 27: 1, 2 and 4 HAProxy + turnout fronts with cluster sync before
// the same replicas, prefix-affinity with its default guards (bounded_load
// 1.1; no session ids here, so new prefixes go by counts at any load),
// request i through front i mod n. Each front counts its peers' decisions
// since the last engine scrape into its load figure.
func TestClusterFronts(t *testing.T) {
	// Requests of ~45 ms, several times the sync's 5 ms batching as with any
	// real LLM request: at clusterMocks' ~7 ms a peer hears of a decision
	// about when its request ends, and 2 fronts' max/mean went to 1.19
	// (BENCHMARKS.md, issue 27: the spread at 0.1, 0.5 and 1.0).
	const frontsTimeScale = 1.0
	ns := StartNATS(t, 0)
	const docs, reps, conc = 192, 3, 8
	w := newWorkload(docs, reps)
	const policy = "{name: prefix-affinity, params: {block_bytes: 64}}"
	type row struct {
		fronts        int
		hit, maxMean  float64
		reqs          []int64
		p50, p90, p99 time.Duration
		// sync traffic per decision: bytes and messages out (decision
		// batches and load messages together), load messages alone
		bytesPer, msgsPer, loadMsgsPer float64
	}
	var rows []row
	for _, n := range []int{1, 2, 4} {
		ms := clusterMocksScaled(t, fmt.Sprintf("f%d", n), frontsTimeScale)
		var fronts []*hstack
		for k := range n {
			name := fmt.Sprintf("f%d-%d", n, k)
			fronts = append(fronts, startFrontPolicy(t, name, clusterYAML(ns.URL, name), policy, ms))
		}
		for _, f := range fronts {
			Eventually(t, 10*time.Second, "cluster connected", func() bool {
				v, err := Metric(t, f.T.URL+"/metrics", "turnout_cluster_connected")
				return err == nil && v == 1
			})
		}
		durs := replayTimed(t, w, fronts, conc)
		r := row{fronts: n}
		r.hit, r.maxMean, r.reqs = hitAndBalance(ms)
		r.p50, r.p90, r.p99 = pct(durs, 0.5), pct(durs, 0.9), pct(durs, 0.99)
		var bytes, msgs, loads, decs float64
		for _, f := range fronts {
			u := f.T.URL + "/metrics"
			b, _ := Metric(t, u, "turnout_cluster_bytes_total", `direction="out"`)
			m, _ := Metric(t, u, "turnout_cluster_messages_total", `direction="out"`)
			l, _ := Metric(t, u, "turnout_cluster_load_messages_total", `direction="out"`)
			d, _ := Metric(t, u, "turnout_cluster_decisions_total", `result="published"`)
			bytes, msgs, loads, decs = bytes+b, msgs+m, loads+l, decs+d
		}
		if decs > 0 {
			r.bytesPer, r.msgsPer, r.loadMsgsPer = bytes/decs, msgs/decs, loads/decs
		}
		rows = append(rows, r)
	}
	t.Logf("%d requests (%d documents x %d), %d concurrent, 4 replicas, default prefix-affinity, sync on:", len(w.bodies), docs, reps, conc)
	t.Logf("| fronts | hit ratio | vs 1 front | requests max/mean | latency p50/p90/p99 ms | per replica | sync B/decision | msgs/decision (load msgs) |")
	for _, r := range rows {
		t.Logf("| %d | %.3f | %.2f | %.3f | %d/%d/%d | %v | %.0f | %.2f (%.2f) |", r.fronts, r.hit, r.hit/rows[0].hit, r.maxMean,
			r.p50.Milliseconds(), r.p90.Milliseconds(), r.p99.Milliseconds(), r.reqs, r.bytesPer, r.msgsPer, r.loadMsgsPer)
	}
	for _, r := range rows[1:] {
		if r.hit < 0.95*rows[0].hit {
			t.Errorf("%d fronts: hit ratio %.3f < 95%% of one front's %.3f", r.fronts, r.hit, rows[0].hit)
		}
		// The goal is 1.05 (issue 27); the bound is issue 11's 1.1, or
		// 1.1x one front's own max/mean in the same run when that is
		// higher: on this workload one front alone ranges 1.02-1.21
		// (prefix affinity places documents, not requests), so a
		// fixed bound fails on the workload's luck, not on the fronts.
		if bound := max(1.1, 1.1*rows[0].maxMean); r.maxMean > bound {
			t.Errorf("%d fronts: requests max/mean %.3f > %.3f (%v)", r.fronts, r.maxMean, bound, r.reqs)
		}
	}
}

// replayTimed sends the workload through fronts[i%len(fronts)] with conc
// workers and returns each request's duration.
func replayTimed(t *testing.T, w *workload, fronts []*hstack, conc int) []time.Duration {
	idx := make(chan int)
	durs := make([]time.Duration, len(w.bodies))
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				f := fronts[i%len(fronts)]
				r, err := Post(context.Background(), f.client, f.H.URL+"/v1/chat/completions", w.bodies[i], nil)
				if err != nil || r.Status != 200 {
					t.Errorf("request %d: %v %v", i, err, r)
					continue
				}
				durs[i] = r.Dur
			}
		}()
	}
	for i := range w.bodies {
		idx <- i
	}
	close(idx)
	wg.Wait()
	return durs
}

func pct(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
