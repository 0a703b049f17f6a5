package bench

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/estimator"
	"github.com/turnout/turnout/route/policy"
)

// tinySim: block size 4 tokens, 10 ms overhead, 1 ms per uncached token,
// 1 ms per output token after the first.
func tinySim(replicas, maxRunning int) SimOptions {
	return SimOptions{
		Replicas: replicas, BlockSize: 4, CacheBlocks: 64, MaxRunning: maxRunning,
		Timing:   mock.Timing{TTFTOverhead: 10 * time.Millisecond, PerTokenPrefill: time.Millisecond, InterTokenLatency: time.Millisecond, TimeScale: 1},
		Compress: 1, Model: "llama", Seed: 1,
	}
}

// Hand-checked: one replica running one sequence at a time.
//
//	A arrives at 0: 7 words + role token = 8 tokens = 2 blocks, nothing
//	cached: TTFT 10+8 = 18 ms, done at 18 + 2 ITL = 20 ms.
//	B arrives at 5 with the same chunk: queued until 20, then both blocks
//	hit: TTFT 10 ms after admission, first token at 30 (25 after arrival),
//	done at 32 (27 after arrival).
func TestSimulateHandChecked(t *testing.T) {
	reqs := []Request{
		{Index: 0, Arrival: 0, InputTokens: 7, OutputTokens: 3, HashIDs: []uint64{1}},
		{Index: 1, Arrival: 5 * time.Millisecond, InputTokens: 7, OutputTokens: 3, HashIDs: []uint64{1}},
	}
	o := tinySim(1, 1)
	res, err := Simulate(reqs, &rrRouter{n: 1}, o)
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	if res.Requests != 2 || len(res.TTFT) != 2 {
		t.Fatalf("%d requests", res.Requests)
	}
	if res.TTFT[0] != 18*ms || res.E2E[0] != 20*ms || res.TTFT[1] != 25*ms || res.E2E[1] != 27*ms {
		t.Fatalf("TTFT %v E2E %v, want [18ms 25ms] [20ms 27ms]", res.TTFT, res.E2E)
	}
	if res.Span != 32*ms {
		t.Fatalf("span %v, want 32ms", res.Span)
	}
	l := res.Replicas[0]
	if l.Requests != 2 || l.PromptTokens != 16 || l.CachedTokens != 8 || l.OutputTokens != 6 {
		t.Fatalf("replica load %+v", l)
	}
	row := MakeRow("sim", "tiny", PolicySpec{Policy: HAProxyRoundRobin}, res, 0.5, 0.5, 1)
	if row.HitRatio != 0.5 || row.LoadReq != 1 || row.TTFT.P50 != 21.5 || row.RPS != 2/0.032 {
		t.Fatalf("row %+v", row)
	}
	if err := row.Check(); err != nil {
		t.Fatal(err)
	}

	// Unlimited running sequences: B is admitted on arrival and still hits,
	// as A stored its blocks at admission (like vLLM). B finishes first, and
	// results are in completion order.
	o.MaxRunning = 0
	res, err = Simulate(reqs, &rrRouter{n: 1}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.TTFT[0] != 10*ms || res.TTFT[1] != 18*ms || res.Replicas[0].CachedTokens != 8 {
		t.Fatalf("unlimited: TTFT %v cached %d", res.TTFT, res.Replicas[0].CachedTokens)
	}
}

// The client-side bound holds B back until A is done; its TTFT counts the wait.
func TestSimulateConcurrencyBound(t *testing.T) {
	reqs := []Request{
		{Index: 0, Arrival: 0, InputTokens: 7, OutputTokens: 3, HashIDs: []uint64{1}},
		{Index: 1, Arrival: 5 * time.Millisecond, InputTokens: 7, OutputTokens: 3, HashIDs: []uint64{2}},
	}
	o := tinySim(2, 0)
	o.Concurrency = 1
	res, err := Simulate(reqs, &rrRouter{n: 2}, o)
	if err != nil {
		t.Fatal(err)
	}
	// B is sent at 20 to the other (empty) replica: 18 ms TTFT, +15 ms wait.
	if res.TTFT[1] != 33*time.Millisecond {
		t.Fatalf("TTFT %v, want B at 33ms", res.TTFT)
	}
}

// Decisions run through the real handler; every one must be completed at
// its virtual end, so in-flight counts return to zero.
func TestSimulateTurnoutCompletes(t *testing.T) {
	reqs := SyntheticTrace(120, 3)
	o := tinySim(3, 2)
	o.BlockSize = 16
	o.CacheBlocks = 4096
	for _, pol := range []string{policy.LeastRequestType, policy.PrefixAffinityType, policy.SessionHashType, policy.RoundRobinType, policy.KVAwareType} {
		t.Run(pol, func(t *testing.T) {
			r, err := NewRouter(PolicySpec{Policy: pol}, ReplicaNames(3), o)
			if err != nil {
				t.Fatal(err)
			}
			defer r.(*turnoutRouter).Close()
			res, err := Simulate(reqs, r, o)
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != len(reqs) {
				t.Fatalf("%d of %d requests completed", res.Requests, len(reqs))
			}
			for _, e := range r.(*turnoutRouter).srv.Snapshot().Pools()[0].Endpoints {
				if e.Inflight() != 0 {
					t.Fatalf("%s has %d in flight after the run", e.Name, e.Inflight())
				}
			}
			var total int64
			for _, l := range res.Replicas {
				total += l.Requests
			}
			if total != int64(len(reqs)) {
				t.Fatalf("replicas served %d", total)
			}
		})
	}
}

func TestHAProxyModels(t *testing.T) {
	lc := &lcRouter{conns: make([]int, 3), last: -1}
	var got []int
	for range 4 {
		i, _, _ := lc.Route(nil, nil)
		got = append(got, i)
	}
	// Equal counts rotate 0,1,2; then all have one and the rotation goes on.
	if got[0] != 0 || got[1] != 1 || got[2] != 2 || got[3] != 0 {
		t.Fatalf("leastconn picks %v", got)
	}
	_ = lc.Done(1)
	if i, _, _ := lc.Route(nil, nil); i != 1 {
		t.Fatalf("leastconn picked %d, want the idle 1", i)
	}
	rr := &rrRouter{n: 2}
	a, _, _ := rr.Route(nil, nil)
	b, _, _ := rr.Route(nil, nil)
	c, _, _ := rr.Route(nil, nil)
	if a != 0 || b != 1 || c != 0 {
		t.Fatalf("roundrobin %d %d %d", a, b, c)
	}
}

func TestCacheBounds(t *testing.T) {
	r := Request{InputTokens: 7, HashIDs: []uint64{1}}
	other := Request{InputTokens: 7, HashIDs: []uint64{2}}
	// Two equal prompts of 8 tokens (2 blocks of 4): the second is all hits.
	inf, pooled := CacheBounds([]Request{r, r}, 4, 64)
	if inf != 0.5 || pooled != 0.5 {
		t.Fatalf("inf %v pooled %v, want 0.5", inf, pooled)
	}
	// A pooled cache of 2 blocks forgets r while serving other.
	inf, pooled = CacheBounds([]Request{r, other, r}, 4, 2)
	if inf != 1.0/3 || pooled != 0 {
		t.Fatalf("inf %v pooled %v, want 1/3 and 0", inf, pooled)
	}
}

// The sim closes decisions as HAProxy or nginx would: the headers at once,
// the first token's time in tft, which predicted-ttft learns from (one
// first-token error per request); with NoFirstToken nothing teaches it.
func TestSimulateFeedsFirstTokens(t *testing.T) {
	reqs := SyntheticTrace(120, 3)
	for _, noTFT := range []bool{false, true} {
		o := tinySim(3, 2)
		o.BlockSize, o.CacheBlocks, o.NoFirstToken = 16, 4096, noTFT
		r, err := NewRouter(PolicySpec{Policy: policy.PredictedTTFTType}, ReplicaNames(3), o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Simulate(reqs, r, o); err != nil {
			t.Fatal(err)
		}
		pt := r.(*turnoutRouter).srv.Snapshot().Pools()[0].Policy.(*policy.PredictedTTFT)
		want := uint64(len(reqs))
		if noTFT {
			want = 0
		}
		if got := pt.PredictionErrors().Count(estimator.FirstToken); got != want {
			t.Errorf("NoFirstToken %v: %d first-token times learned, want %d", noTFT, got, want)
		}
		r.(*turnoutRouter).Close()
	}
}

// Session moves count a session's requests placed on another replica than
// its previous one: round robin over 2 replicas moves every repeat of a
// session whose requests alternate, never one whose requests land two
// apart.
func TestSimulateSessionMoves(t *testing.T) {
	ms := time.Millisecond
	var reqs []Request
	// a, b, a, a, c: round robin sends them to 0, 1, 0, 1, 0.
	for i, s := range []string{"a", "b", "a", "a", "c"} {
		reqs = append(reqs, Request{Index: i, Arrival: time.Duration(i) * ms, InputTokens: 7, OutputTokens: 1, HashIDs: []uint64{uint64(i + 1)}, Session: s})
	}
	reqs = append(reqs, Request{Index: 5, Arrival: 5 * ms, InputTokens: 7, OutputTokens: 1, HashIDs: []uint64{9}})
	res, err := Simulate(reqs, &rrRouter{n: 2}, tinySim(2, 0))
	if err != nil {
		t.Fatal(err)
	}
	// a's repeats: 0 -> 0 (stays), 0 -> 1 (moves); b and c have none.
	if res.SessionRepeats != 2 || res.SessionMoves != 1 {
		t.Fatalf("session moves %d of %d repeats, want 1 of 2", res.SessionMoves, res.SessionRepeats)
	}
}

// TestSimulateRouteBody: with SimOptions.RouteBody turnout sees each body
// cut, as behind a proxy with that route_body, so kv-aware falls back to
// prefix-affinity on the long prompts; without it, never for that reason.
func TestSimulateRouteBody(t *testing.T) {
	reqs := SyntheticTrace(60, 3)
	truncated := func(routeBody int) int {
		o := tinySim(3, 2)
		o.BlockSize, o.CacheBlocks, o.RouteBody = 16, 4096, routeBody
		r, err := NewRouter(PolicySpec{Policy: policy.KVAwareType}, ReplicaNames(3), o)
		if err != nil {
			t.Fatal(err)
		}
		tr := r.(*turnoutRouter)
		defer tr.Close()
		if _, err := Simulate(reqs, r, o); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		tr.srv.WriteMetrics(&b)
		m := regexp.MustCompile(`turnout_kv_fallbacks_total\{[^}]*reason="body_truncated"[^}]*\} (\d+)`).FindStringSubmatch(b.String())
		if m == nil {
			return 0
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := truncated(0); n != 0 {
		t.Fatalf("whole bodies: %d body_truncated fallbacks", n)
	}
	if n := truncated(1024); n == 0 {
		t.Fatal("bodies cut at 1024 bytes: no body_truncated fallback")
	}
}
