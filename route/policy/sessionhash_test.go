package policy

import (
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
	const a, b = 0xabcdef0123450007, 0x1111111111110007 // same slot, other tags
	if _, ok := m.lookup(a); ok {
		t.Fatal("empty memory knows a session")
	}
	m.store(a, 2)
	if i, ok := m.lookup(a); !ok || i != 2 {
		t.Fatalf("lookup a = %d %v, want 2 true", i, ok)
	}
	if _, ok := m.lookup(b); ok {
		t.Fatal("another session in the same slot is known")
	}
	m.store(b, 0)
	if _, ok := m.lookup(a); ok {
		t.Fatal("a survived b taking its slot")
	}
	if i, ok := m.lookup(b); !ok || i != 0 {
		t.Fatalf("lookup b = %d %v, want 0 true", i, ok)
	}
	if off := newSessionMemory(0); off.on() {
		t.Fatal("sessions 0 made a memory")
	}
}
