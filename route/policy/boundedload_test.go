package policy

import (
	"slices"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
)

// Served counts decisions here and by peers since the previous window
// started, so a window turning over never starts the bound from nothing.
func TestEndpointServedSpansTwoWindows(t *testing.T) {
	p := routetest.Pool(t, 1, nil)
	e := p.Endpoints[0]
	if e.Served() != 0 {
		t.Fatalf("served %d before any window, want 0", e.Served())
	}
	e.StartWindow()
	e.State.Decisions.Add(3)
	e.NotePeerDecision()
	if e.Served() != 4 || e.Recent() != 4 {
		t.Fatalf("served %d recent %d, want 4 and 4", e.Served(), e.Recent())
	}
	e.StartWindow()
	e.State.Decisions.Add(2)
	if e.Served() != 6 || e.Recent() != 2 {
		t.Fatalf("after a new window: served %d recent %d, want 6 and 2", e.Served(), e.Recent())
	}
	e.StartWindow()
	if e.Served() != 2 {
		t.Fatalf("two windows on: served %d, want 2 (the first window forgotten)", e.Served())
	}
}

// The bounded-load guard: a prefix's home is refused once it served more
// than (1+ε) times the mean lately (peers' decisions included), and a miss
// goes to the least-served replica near the lowest load.
func TestPrefixAffinityBoundedLoad(t *testing.T) {
	sys := string(make([]byte, 64*20)) // 20 shared blocks
	for _, tc := range []struct {
		name    string
		eps     float64
		warm    int      // endpoint sent the shared prefix first (-1: none)
		served  []int    // peer decisions per endpoint in the window
		loads   []int64  // in flight, or engine-reported with waiting
		waiting []int64  // nil: no engine figure
		req     []uint64 // request blocks
		want    string   // "a|b": either
		outcome fleet.Outcome
		session bool // the request has a session id
	}{
		// No replica is idle in the cases up to the "idle replica" ones.
		// Total 23, ε 0.5: bound ceil(1.5·24/4) = 9.
		{"home within bound", 0.5, 2, []int{5, 5, 8, 5}, []int64{1, 1, 1, 1}, nil, blocksOf(sys, 2), "e2", fleet.OutcomeAffinity, false},
		// Total 24: bound 10 (ceil 9.375); e2 at 12 would take its 13th.
		{"home over bound: least served instead", 0.5, 2, []int{4, 6, 12, 2}, []int64{1, 1, 1, 1}, nil, blocksOf(sys, 2), "e3", fleet.OutcomeOverflow, false},
		{"guard off: home however busy", 0, 2, []int{4, 6, 12, 2}, []int64{1, 1, 1, 1}, nil, blocksOf(sys, 2), "e2", fleet.OutcomeAffinity, false},
		// e3 served fewest but is 2 above the lowest load: e1 instead, one
		// above it, where its engine would start it at once.
		{"miss: least served within one of the lowest load", 1, -1, []int{5, 3, 7, 1}, []int64{2, 2, 1, 3}, []int64{0, 0, 0, 0}, blocksOf("other", 10), "e1", fleet.OutcomeBalanced, false},
		// e0's and e1's engines queue: the miss never waits to even counts out.
		{"miss: one above the lowest load but queueing", 1, -1, []int{5, 3, 7, 1}, []int64{2, 2, 1, 3}, []int64{1, 1, 0, 0}, blocksOf("other", 10), "e2", fleet.OutcomeBalanced, false},
		// No engine figure: whether e1 would queue is unknown.
		{"miss: no engine figure, lowest load only", 1, -1, []int{5, 3, 7, 1}, []int64{2, 2, 1, 3}, nil, blocksOf("other", 10), "e2", fleet.OutcomeBalanced, false},
		// Two at the lowest load: the one that served fewer.
		{"miss: least served at the lowest load", 1, -1, []int{5, 3, 2, 1}, []int64{1, 2, 1, 3}, nil, blocksOf("other", 10), "e2", fleet.OutcomeBalanced, false},
		{"miss: guard off goes least loaded", 0, -1, []int{5, 3, 7, 1}, []int64{2, 2, 1, 3}, []int64{0, 0, 0, 0}, blocksOf("other", 10), "e2", fleet.OutcomeBalanced, false},
		// e3 is idle: nothing queues, so the home keeps its prefix however
		// many it served.
		{"idle replica: home over bound kept", 0.5, 2, []int{4, 6, 12, 2}, []int64{1, 1, 1, 0}, nil, blocksOf(sys, 2), "e2", fleet.OutcomeAffinity, false},
		// e1 and e2 are idle, and the request has no session id: counts
		// still even out (e0 served fewest, one above the lowest load where
		// its engine starts it at once).
		{"idle replica, no session: miss by counts", 1, -1, []int{2, 7, 5, 1}, []int64{1, 0, 0, 2}, []int64{0, 0, 0, 0}, blocksOf("other", 10), "e0", fleet.OutcomeBalanced, false},
		// The same with a session id: the session tie-break among the idle
		// (CountsGate), so a session's first turns stay together.
		{"idle replica, session: miss not by counts", 1, -1, []int{2, 7, 5, 1}, []int64{1, 0, 0, 2}, []int64{0, 0, 0, 0}, blocksOf("other", 10), "e1|e2", fleet.OutcomeAffinity, true},
		// No replica idle: a session's miss goes by counts too.
		{"none idle, session: miss by counts", 1, -1, []int{2, 7, 5, 1}, []int64{2, 1, 1, 3}, []int64{0, 0, 0, 0}, blocksOf("other", 10), "e0", fleet.OutcomeBalanced, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultPrefixAffinityConfig()
			cfg.BlockBytes = 64
			cfg.BoundedLoad = tc.eps
			var pa *PrefixAffinity
			p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { pa = NewPrefixAffinity(cfg, p, fleet.NewRand(5)); return pa })
			if tc.warm >= 0 {
				pa.lrus[tc.warm].insert(blocksOf(sys, 1))
			}
			for i, e := range p.Endpoints {
				e.StartWindow()
				for j := 0; j < tc.served[i]; j++ {
					e.NotePeerDecision()
				}
				if tc.waiting == nil {
					e.AddInflight(tc.loads[i])
				} else {
					e.SetEngineLoad(&fleet.EngineLoad{Requests: tc.loads[i], Waiting: tc.waiting[i], KVUsage: -1, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
				}
			}
			r := &fleet.Request{Blocks: tc.req, HasSession: tc.session, SessionHash: 42}
			c := routetest.Choose(p, r, 3)
			if got := c.Endpoints; !slices.Contains(strings.Split(tc.want, "|"), got[0].Name) || c.Outcome != tc.outcome {
				t.Fatalf("pick %s outcome %v; want %s %v", routetest.Names(got), c.Outcome, tc.want, tc.outcome)
			}
		})
	}
}

func TestBoundedLoadValidate(t *testing.T) {
	for _, v := range []float64{-0.1, 101} {
		cfg := DefaultPrefixAffinityConfig()
		cfg.BoundedLoad = v
		if cfg.Validate() == nil {
			t.Fatalf("bounded_load %v accepted", v)
		}
	}
}
