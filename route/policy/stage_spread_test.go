package policy

import (
	"testing"

	"github.com/turnout/turnout/route/fleet"
)

// PeerSpread: alone it leaves the request to the fill; with peers it
// draws among the endpoints at most Slack above the lowest load, every one
// of them sometimes and never one above; unusable endpoints and an
// already placed request are left alone; and a draw allocates nothing.
func TestPeerSpread(t *testing.T) {
	loads := []int64{3, 4, 3, 6, 5}
	setup := func(peers bool) *fleet.Pool {
		p := goldenPool(len(loads))
		for i, l := range loads {
			p.Endpoints[i].AddInflight(l)
		}
		if peers {
			p.Endpoints[3].NotePeerDecision() // any endpoint's will do
		}
		return p
	}
	pick := func(ps *PeerSpread, p *fleet.Pool, pre *fleet.Endpoint) *fleet.Endpoint {
		ch := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, 2)}
		if pre != nil {
			ch.Endpoints = append(ch.Endpoints, pre)
		}
		c := &Cycle{Req: &fleet.Request{}, Pool: p, Choice: ch}
		c.summarize(false)
		ps.Pick(c)
		if len(ch.Endpoints) == 0 || (pre != nil && len(ch.Endpoints) == 1) {
			return nil
		}
		return ch.Endpoints[len(ch.Endpoints)-1]
	}
	ps := &PeerSpread{Rand: fleet.NewRand(7), Slack: 1}
	if e := pick(ps, setup(false), nil); e != nil {
		t.Fatalf("alone: picked %s, want none (the fill's)", e.Name)
	}
	p := setup(true)
	if e := pick(ps, p, p.Endpoints[4]); e != nil {
		t.Fatalf("already placed: picked %s too", e.Name)
	}
	seen := map[string]int{}
	for range 300 {
		e := pick(ps, p, nil)
		if e == nil {
			t.Fatal("with peers: nothing picked")
		}
		seen[e.Name]++
	}
	if len(seen) != 3 || seen["e0"] == 0 || seen["e1"] == 0 || seen["e2"] == 0 {
		t.Fatalf("picks %v, want e0, e1 and e2 (loads 3, 4, 3 within 1 of 3), never e3 or e4", seen)
	}
	p.Endpoints[1].SetDown(true)
	p.Endpoints[2].SetDown(true)
	// One candidate left in the band: the fill's job.
	if e := pick(ps, p, nil); e != nil {
		t.Fatalf("one candidate: picked %s, want none", e.Name)
	}
	p.Endpoints[1].SetDown(false)
	ch := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, 2)}
	c := &Cycle{Req: &fleet.Request{}, Pool: p, Choice: ch}
	run := func() {
		ch.Endpoints = ch.Endpoints[:0]
		*c = Cycle{Req: c.Req, Pool: p, Choice: ch}
		c.summarize(false)
		ps.Pick(c)
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("%v allocations per pick", n)
	}
}

// LeastLoadedRecent's PeerSlack keeps endpoints just above the lowest
// load only when peers send to them, and never beyond the slack.
func TestLeastLoadedRecentPeerSlack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		load  int64
		peers bool
		slack int64
		want  bool
	}{
		{"at the minimum", 3, false, 1, true},
		{"above, alone", 4, false, 1, false},
		{"above, peers", 4, true, 1, true},
		{"above the slack, peers", 5, true, 1, false},
		{"above, peers, no slack", 4, true, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goldenPool(2)
			e := p.Endpoints[0]
			e.AddInflight(tc.load)
			if tc.peers {
				e.NotePeerDecision()
			}
			c := &Cycle{Pool: p, MinLoad: 3, MinRecent: 5, N: 2}
			f := &LeastLoadedRecent{Slack: 4, PeerSlack: tc.slack}
			if got := f.Keep(c, e); got != tc.want {
				t.Fatalf("keep %v, want %v", got, tc.want)
			}
		})
	}
}
