package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/route/policy"
)

// The sim's fronts share prefixes through the modelled sync: two fronts
// with a short delay keep one front's hits, and with a delay longer than
// the replay (nothing delivered) they lose them; every decision is closed
// and no peer load is left over once the messages in flight are delivered.
func TestSimFrontsSync(t *testing.T) {
	// Pairs of requests sharing a prompt, no session id: the pair's second
	// request goes through the other front, which knows the prefix only
	// from the sync.
	var reqs []Request
	for i := range 300 {
		ids := []uint64{uint64(i/2) + 1, uint64(i/2) + 1<<20, uint64(i/2) + 1<<21, uint64(i) + 1<<22}
		reqs = append(reqs, Request{Index: i, Arrival: time.Duration(i) * 50 * time.Millisecond,
			InputTokens: len(ids) * BlockTokens, OutputTokens: 4, HashIDs: ids})
	}
	o := tinySim(4, 0)
	o.BlockSize = 16
	o.CacheBlocks = 1 << 14
	hit := func(fronts int, delay time.Duration) (float64, *frontsRouter) {
		t.Helper()
		o := o
		o.SyncDelay = delay
		fr, err := newFrontsRouter(PolicySpec{Policy: policy.PrefixAffinityType}, ReplicaNames(4), o, fronts, FrontOf(reqs, fronts, SplitRequest, o.Seed))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fr.Close() })
		res, err := Simulate(reqs, fr, o)
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != len(reqs) || len(fr.open) != 0 {
			t.Fatalf("%d fronts, delay %v: %d of %d completed, %d open", fronts, delay, res.Requests, len(reqs), len(fr.open))
		}
		return MakeRow("sim", "t", PolicySpec{Policy: policy.PrefixAffinityType}, res, 0, 0, 1).HitRatio, fr
	}
	one, _ := hit(1, time.Millisecond)
	synced, fr := hit(2, time.Millisecond)
	apart, _ := hit(2, 1000*time.Hour)
	if one < 0.3 {
		t.Fatalf("one front's hit ratio %.3f: the trace shares too little to test", one)
	}
	t.Logf("hit ratio: one front %.3f, two synced %.3f, two never synced %.3f", one, synced, apart)
	if synced < 0.98*one || apart > 0.9*synced {
		t.Fatalf("hit ratio: one front %.3f, two synced %.3f, two never synced %.3f", one, synced, apart)
	}
	fr.SetNow(1<<62 - 1) // deliver what is still in flight
	for f, front := range fr.fronts {
		for _, e := range front.srv.Snapshot().Pools()[0].Endpoints {
			if e.PeerMark() != 0 || e.Inflight() != 0 {
				t.Fatalf("front %d, %s: peer load %d, in flight %d after the run", f, e.Name, e.PeerMark(), e.Inflight())
			}
		}
	}
}

// --fronts in the sim: one row per count, rounds replayed with their own
// seeds, and the means over rounds in the fronts table.
func TestRunSimFrontsRounds(t *testing.T) {
	reqs := SyntheticTrace(150, 2)
	o := tinySim(3, 2)
	o.BlockSize, o.CacheBlocks = 16, 4096
	o.Fronts, o.SyncDelay, o.Parallel = []int{1, 2, 1, 2}, 2*time.Millisecond, 2
	rows, err := RunSim(reqs, "t", []PolicySpec{{Policy: policy.PrefixAffinityType}, {Policy: HAProxyRoundRobin}}, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8", len(rows))
	}
	for i, r := range rows[:4] {
		if r.Fronts != o.Fronts[i] || r.Requests != len(reqs) || r.Note != "" {
			t.Errorf("row %d: fronts %d, requests %d, note %q", i, r.Fronts, r.Requests, r.Note)
		}
	}
	if n := rows[4].Note; !strings.Contains(n, "turnout policy") {
		t.Errorf("a proxy's own balancing with --fronts: note %q", n)
	}
	var b bytes.Buffer
	if err := WriteFrontsTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "means over rounds") {
		t.Errorf("no means over two rounds:\n%s", b.String())
	}
}

func TestFrontsMeans(t *testing.T) {
	rows := []Row{
		{Trace: "t", Policy: "p", Fronts: 1, HitRatio: 0.5, LoadReq: 1.02, EngineTTFT: 100, TTFT: Summary{P90: 10, P99: 20}},
		{Trace: "t", Policy: "p", Fronts: 2, HitRatio: 0.49, LoadReq: 1.04, EngineTTFT: 110, TTFT: Summary{P90: 11, P99: 18}},
		{Trace: "t", Policy: "p", Fronts: 1, HitRatio: 0.4, LoadReq: 1.04, EngineTTFT: 200, TTFT: Summary{P90: 20, P99: 40}},
		{Trace: "t", Policy: "p", Fronts: 2, HitRatio: 0.4, LoadReq: 1.08, EngineTTFT: 210, TTFT: Summary{P90: 18, P99: 48}},
		{Trace: "t", Policy: "q", Fronts: 1, HitRatio: 0.4, LoadReq: 1.04},
		{Trace: "t", Policy: "q", Fronts: 4, HitRatio: 0.4, LoadReq: 1.04}, // one round: no mean
	}
	ms := FrontsMeans(FrontsLines(rows))
	if len(ms) != 2 {
		t.Fatalf("%d means, want 2 (p at 1 and 2 fronts): %+v", len(ms), ms)
	}
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	one, two := ms[0], ms[1]
	if one.Fronts != 1 || one.Rounds != 2 || !near(one.LoadReq, 1.03) || !near(one.P90, 1) {
		t.Errorf("one front: %+v", one)
	}
	if two.Fronts != 2 || two.Rounds != 2 || !near(two.Hit, (0.98+1)/2) || !near(two.LoadReq, 1.06) || !near(two.WorstLoadReq, 1.08) ||
		!near(two.P90, (1.1+0.9)/2) || !near(two.P99, (0.9+1.2)/2) || !near(two.Engine, (1.1+1.05)/2) {
		t.Errorf("two fronts: %+v", two)
	}
}

// recFronts records each decision's replica.
type recFronts struct {
	*frontsRouter
	picks []int
}

func (r *recFronts) Route(q *Request, body []byte) (int, uint64, error) {
	i, tok, err := r.frontsRouter.Route(q, body)
	r.picks = append(r.picks, i)
	return i, tok, err
}

// With no sync delay and session ids (no random tie left), any number of
// fronts places every request where one front does: the sync carries
// everything a front decides on, short prompts included (a decision
// without a full block used to go unshared, and two fronts diverged).
func TestSimFrontsNoDelayPlaceAsOne(t *testing.T) {
	reqs := SyntheticTrace(300, 9)
	for i := range reqs {
		if i%7 == 3 { // a prompt shorter than one block
			reqs[i].InputTokens, reqs[i].HashIDs = 3, []uint64{uint64(1<<40 + i)}
		}
	}
	o := tinySim(4, 3)
	o.BlockSize, o.CacheBlocks = 16, 1<<12
	picks := func(n int) []int {
		fr, err := newFrontsRouter(PolicySpec{Policy: policy.PrefixAffinityType}, ReplicaNames(4), o, n, FrontOf(reqs, n, SplitRequest, o.Seed))
		if err != nil {
			t.Fatal(err)
		}
		defer fr.Close()
		rr := &recFronts{frontsRouter: fr}
		if _, err := Simulate(reqs, rr, o); err != nil {
			t.Fatal(err)
		}
		return rr.picks
	}
	one := picks(1)
	for _, n := range []int{2, 3} {
		got := picks(n)
		for i := range one {
			if got[i] != one[i] {
				t.Fatalf("%d fronts: request %d went to replica %d, one front sent it to %d", n, i, got[i], one[i])
			}
		}
	}
}

// The sim's sync goes through route/cluster's wire format: a decision is
// a batch of one record plus the front's load message, a completion a
// load message (3 messages per decision, one front's too: it publishes
// to no one), and the cost is counted.
func TestSimFrontsSyncCost(t *testing.T) {
	reqs := SyntheticTrace(120, 2)
	o := tinySim(3, 2)
	o.BlockSize, o.CacheBlocks = 16, 4096
	o.Fronts, o.SyncDelay, o.Parallel = []int{1, 4}, time.Millisecond, 1
	rows, err := RunSim(reqs, "t", []PolicySpec{{Policy: policy.PrefixAffinityType}}, o)
	if err != nil {
		t.Fatal(err)
	}
	one, four := rows[0], rows[1]
	if one.SyncMsgs != 3 || four.SyncMsgs != 3 {
		t.Errorf("%.2f and %.2f messages per decision (1 and 4 fronts), want 3", one.SyncMsgs, four.SyncMsgs)
	}
	// A load message is at least the header and one record per replica;
	// a batch carries the prompt's blocks at 8 bytes each.
	if four.SyncBytes < 3*30 || four.SyncUs <= 0 {
		t.Errorf("4 fronts: %.0f B and %.3f µs per decision", four.SyncBytes, four.SyncUs)
	}
}

// With shared scrapes the sim's engine figures reach a replica's owner at
// the scrape and the other fronts one sync delay later; without, every
// front at once.
func TestSimFrontsSharedScrapes(t *testing.T) {
	o := tinySim(4, 0)
	o.SyncDelay = 10 * time.Millisecond
	for _, shared := range []bool{false, true} {
		o.SharedScrapes = shared
		fr, err := newFrontsRouter(PolicySpec{Policy: policy.PrefixAffinityType}, ReplicaNames(4), o, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fr.Close() })
		fr.SetNow(0)
		fr.ReportEngine(1, 5, 2) // replica 1: front 1 owns it
		requests := func(front int) int64 {
			if el := fr.fronts[front].endpoint(1).Engine(); el != nil {
				return el.Requests
			}
			return -1
		}
		want0 := int64(7)
		if shared {
			want0 = -1
		}
		if requests(1) != 7 || requests(0) != want0 {
			t.Fatalf("shared %v: at the scrape front 0 reads %d, front 1 %d; want %d, 7", shared, requests(0), requests(1), want0)
		}
		fr.SetNow(20 * time.Millisecond)
		if requests(0) != 7 {
			t.Fatalf("shared %v: after the sync delay front 0 reads %d, want 7", shared, requests(0))
		}
	}
}
