package policy

import (
	"fmt"
	"slices"
	"testing"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
)

func sessionReq(key string) *fleet.Request {
	return &fleet.Request{Session: []byte(key), HasSession: true, SessionHash: fleet.HashKey([]byte(key))}
}

// setLoads gives the named endpoint home and every other endpoint others in
// flight, whatever they held before.
func setLoads(p *fleet.Pool, home string, load, others int64) {
	for _, e := range p.Endpoints {
		want := others
		if e.Name == home {
			want = load
		}
		e.AddInflight(want - e.Inflight())
	}
}

// The session memory's two rules (issue 27 item 4): a session this
// instance has not placed yet is bounded by new_load_factor (at or below
// the mean), one it placed before by load_factor, first on the replica it
// was last placed on. sessions: 0 is the ring alone.
func TestSessionHashMemoryRules(t *testing.T) {
	type step struct {
		load, others int64 // in flight on the ring home, on every other
		moved        bool  // picked off the ring home
		outcome      fleet.Outcome
	}
	for _, tc := range []struct {
		name     string
		sessions int
		steps    []step
	}{
		// 11 of 35 in flight: new bound ceil(36/4) = 9, old ceil(1.25·36/4) = 12.
		{"new session above the mean goes on", 1 << 10, []step{{11, 8, true, fleet.OutcomeOverflow}}},
		{"known session above the mean stays", 1 << 10, []step{{0, 0, false, fleet.OutcomeAffinity}, {11, 8, false, fleet.OutcomeAffinity}}},
		{"no memory: every session is bounded by load_factor", 0, []step{{11, 8, false, fleet.OutcomeAffinity}}},
		// The min_inflight floor (4) still keeps a new session home at low traffic.
		{"new session under min_inflight stays", 1 << 10, []step{{3, 0, false, fleet.OutcomeAffinity}}},
		// Moved off (20 of 26 in flight), then the home empties: it stays
		// where it moved, where its cache now is.
		{"moved session stays moved", 1 << 10, []step{{20, 2, true, fleet.OutcomeOverflow}, {0, 0, true, fleet.OutcomeAffinity}}},
		{"no memory: moved session goes home", 0, []step{{20, 2, true, fleet.OutcomeOverflow}, {0, 0, false, fleet.OutcomeAffinity}}},
		// Every other replica, the one it moved to included, then holds 20
		// and its home 2: past load_factor there, so back home.
		{"moved session leaves its new replica past load_factor", 1 << 10, []step{{20, 2, true, fleet.OutcomeOverflow}, {2, 20, false, fleet.OutcomeAffinity}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultSessionHashConfig()
			// The loads above are set for this bound (with every other
			// replica equal, twice the mean is never passed by them).
			cfg.LoadFactor = 1.25
			cfg.Sessions = tc.sessions
			p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { return NewSessionHash(cfg, p, fleet.NewRand(1)) })
			// The ring home, from a pool without memory.
			home := sessionPick(newSessionPool(t, 4), "s1")
			for i, st := range tc.steps {
				setLoads(p, home, st.load, st.others)
				c := routetest.Choose(p, sessionReq("s1"), 3)
				got := c.Endpoints
				if (got[0].Name != home) != st.moved || c.Outcome != st.outcome {
					t.Fatalf("step %d: pick %s (home %s) outcome %v, want moved %v %v", i, routetest.Names(got), home, c.Outcome, st.moved, st.outcome)
				}
			}
		})
	}
}

// A reload or discovery change keeps a moved session where it moved: the
// memory is carried by endpoint name, whatever the new pool's order, and
// an endpoint gone takes its sessions with it.
func TestSessionHashCarry(t *testing.T) {
	cfg := DefaultSessionHashConfig()
	build := func(p *fleet.Pool) fleet.Policy { return NewSessionHash(cfg, p, fleet.NewRand(1)) }
	old := routetest.Pool(t, 4, build)
	home := sessionPick(newSessionPool(t, 4), "s1")
	setLoads(old, home, 20, 2)
	moved := routetest.Choose(old, sessionReq("s1"), 1).Endpoints[0].Name
	if moved == home {
		t.Fatalf("s1 stayed on its loaded home %s", home)
	}
	for _, tc := range []struct {
		name  string
		order []string // the new pool's endpoints
		want  string
	}{
		{"same pool", []string{"e0", "e1", "e2", "e3"}, moved},
		{"reordered", []string{"e3", "e1", "e0", "e2"}, moved},
		{"moved-to replica gone: ring home", slices.DeleteFunc([]string{"e0", "e1", "e2", "e3"}, func(n string) bool { return n == moved }), home},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := routetest.Pool(t, 4, nil)
			p := &fleet.Pool{Name: src.Name, Deployment: src.Deployment, Role: src.Role, Metrics: src.Metrics}
			for _, n := range tc.order {
				e := *src.Endpoints[n[1]-'0']
				e.Index = len(p.Endpoints)
				p.Endpoints = append(p.Endpoints, &e)
			}
			pol := build(p)
			pol.(fleet.Stater).Carry(old.Policy)
			p.Policy = pol
			if got := routetest.Choose(p, sessionReq("s1"), 1).Endpoints[0].Name; got != tc.want {
				t.Fatalf("s1 on %s after the reload, want %s", got, tc.want)
			}
		})
	}
	// Without Carry the new pool has forgotten: s1 goes home.
	fresh := routetest.Pool(t, 4, build)
	if got := routetest.Choose(fresh, sessionReq("s1"), 1).Endpoints[0].Name; got != home {
		t.Fatalf("fresh pool put s1 on %s, want its home %s", got, home)
	}
}

func TestSessionMemory(t *testing.T) {
	m := newSessionMemory(1000)
	if len(m.slots) != 1024 {
		t.Fatalf("%d slots for 1000, want 1024", len(m.slots))
	}
	// Five sessions of one bucket (the same low bits, other tags).
	var same [memWays + 1]uint64
	for i := range same {
		same[i] = uint64(i+1)<<40 | 0x0123450007
	}
	if _, ok := m.lookup(same[0]); ok {
		t.Fatal("empty memory knows a session")
	}
	for i, h := range same[:memWays] {
		m.store(h, i)
	}
	for i, h := range same[:memWays] {
		if got, ok := m.lookup(h); !ok || got != i {
			t.Fatalf("session %d of a full bucket: lookup = %d %v, want %d true", i, got, ok, i)
		}
	}
	if _, ok := m.lookup(same[memWays]); ok {
		t.Fatal("a session never stored is known")
	}
	// A move rewrites the session's own word.
	m.store(same[1], 3)
	if got, ok := m.lookup(same[1]); !ok || got != 3 {
		t.Fatalf("moved session: lookup = %d %v, want 3 true", got, ok)
	}
	// A fifth session evicts exactly one of the four.
	m.store(same[memWays], 2)
	if got, ok := m.lookup(same[memWays]); !ok || got != 2 {
		t.Fatalf("fifth session: lookup = %d %v, want 2 true", got, ok)
	}
	known := 0
	for _, h := range same[:memWays] {
		if _, ok := m.lookup(h); ok {
			known++
		}
	}
	if known != memWays-1 {
		t.Fatalf("%d of the first %d sessions known after a fifth, want %d", known, memWays, memWays-1)
	}
	if tiny := newSessionMemory(1); len(tiny.slots) != memWays {
		t.Fatalf("sessions 1 made %d slots, want one bucket of %d", len(tiny.slots), memWays)
	}
	if off := newSessionMemory(0); off.on() {
		t.Fatal("sessions 0 made a memory")
	}
}

// setEach gives endpoint i load[i] in flight, whatever it held before.
func setEach(p *fleet.Pool, load ...int64) {
	for i, e := range p.Endpoints {
		e.AddInflight(load[i] - e.Inflight())
	}
}

// An operator who configured session-hash gets sticky sessions with the
// defaults: every request of a session lands on the replica its first
// request went to while that replica is healthy and within load_factor of
// the mean, whatever the load level and its spread within the bound. A
// session whose replica goes down or is overloaded moves, no other does,
// and a moved session stays where it moved (its cache is there now).
func TestSessionHashSticky(t *testing.T) {
	p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy {
		return NewSessionHash(DefaultSessionHashConfig(), p, fleet.NewRand(1))
	})
	keys := make([]string, 400)
	for i := range keys {
		keys[i] = fmt.Sprintf("conv-%d", i)
	}
	where := map[string]string{}
	perEndpoint := map[string]int{}
	for i, k := range keys {
		// The first requests at an even load: each session on its ring home.
		setEach(p, int64(i%7), int64(i%7), int64(i%7), int64(i%7))
		where[k] = sessionPick(p, k)
		perEndpoint[where[k]]++
	}
	for _, e := range p.Endpoints {
		if n := perEndpoint[e.Name]; n < len(keys)/4/2 {
			t.Fatalf("%s holds %d of %d sessions: %v", e.Name, n, len(keys), perEndpoint)
		}
	}
	check := func(step string, moves func(old string) bool) {
		t.Helper()
		for _, k := range keys {
			got := sessionPick(p, k)
			switch {
			case moves(where[k]) && got == where[k]:
				t.Fatalf("%s: %s stayed on %s", step, k, got)
			case !moves(where[k]) && got != where[k]:
				t.Fatalf("%s: %s moved from %s to %s", step, k, where[k], got)
			}
			where[k] = got
		}
	}
	stay := func(string) bool { return false }
	// Later turns at other levels, spread within 1.25x the mean (with this
	// request; the default load_factor is 2), or under min_inflight.
	for _, l := range [][]int64{{0, 0, 0, 0}, {3, 0, 1, 2}, {10, 10, 10, 10}, {11, 9, 10, 8}, {40, 40, 40, 40}, {48, 36, 40, 38}, {3, 0, 0, 0}} {
		setEach(p, l...)
		for range 3 {
			check(fmt.Sprintf("loads %v", l), stay)
		}
	}
	// e1 down: its sessions move, the rest stay; e1 back: the moved ones
	// stay where they went.
	setEach(p, 10, 10, 10, 10)
	p.Endpoints[1].SetDown(true)
	check("e1 down", func(old string) bool { return old == "e1" })
	p.Endpoints[1].SetDown(false)
	check("e1 up again", stay)
	// e2 overloaded (40 against 10: past twice the mean): its sessions move.
	setEach(p, 10, 10, 40, 10)
	check("e2 overloaded", func(old string) bool { return old == "e2" })
}
