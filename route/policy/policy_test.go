package policy

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"

	"gopkg.in/yaml.v3"
)

func TestRoundRobin(t *testing.T) {
	for _, tc := range []struct {
		name  string
		down  []int
		picks int
		want  []string
	}{
		{"rotates", nil, 1, []string{"e0", "e1", "e2", "e0"}},
		{"skips down", []int{1}, 1, []string{"e0", "e2", "e2", "e0"}},
		{"fallbacks continue rotation", nil, 3, []string{"e0,e1,e2", "e1,e2,e0"}},
		{"all down", []int{0, 1, 2}, 1, []string{"", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := routetest.Pool(t, 3, func(*fleet.Pool) fleet.Policy { return &RoundRobin{} })
			for _, i := range tc.down {
				p.Endpoints[i].SetDown(true)
			}
			for i, want := range tc.want {
				got := routetest.Names(routetest.Choose(p, &fleet.Request{}, tc.picks).Endpoints)
				if got != want {
					t.Fatalf("pick %d = %q, want %q", i, got, want)
				}
			}
		})
	}
}

func TestLeastRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loads []int64
		down  []int
		want  string // required first pick ("" = any)
		never string
	}{
		{"two endpoints: least wins", []int64{5, 1}, nil, "e1", ""},
		{"never the most loaded of three", []int64{9, 0, 0}, nil, "", "e0"},
		{"down skipped", []int64{0, 9}, []int{0}, "e1", ""},
		{"single", []int64{3}, nil, "e0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := routetest.Pool(t, len(tc.loads), func(*fleet.Pool) fleet.Policy { return NewLeastRequest(fleet.NewRand(7)) })
			for i, l := range tc.loads {
				p.Endpoints[i].AddInflight(l)
			}
			for _, i := range tc.down {
				p.Endpoints[i].SetDown(true)
			}
			for i := 0; i < 200; i++ {
				got := routetest.Choose(p, &fleet.Request{}, 1).Endpoints
				if len(got) != 1 {
					t.Fatalf("no pick")
				}
				if tc.want != "" && got[0].Name != tc.want {
					t.Fatalf("pick = %s, want %s", got[0].Name, tc.want)
				}
				if got[0].Name == tc.never {
					t.Fatalf("picked %s", tc.never)
				}
			}
		})
	}
}

// Equal loads: the random tie-break spreads picks evenly (±10% over 10k).
func TestLeastRequestTieSpread(t *testing.T) {
	p := routetest.Pool(t, 4, func(*fleet.Pool) fleet.Policy { return NewLeastRequest(fleet.NewRand(3)) })
	counts := map[string]int{}
	const n = 10000
	for i := 0; i < n; i++ {
		counts[routetest.Choose(p, &fleet.Request{}, 1).Endpoints[0].Name]++
	}
	for name, c := range counts {
		if math.Abs(float64(c)-n/4) > n/4*0.1 {
			t.Fatalf("%s got %d of %d", name, c, n)
		}
	}
	if len(counts) != 4 {
		t.Fatalf("only %d endpoints picked", len(counts))
	}
}

func sessionPick(p *fleet.Pool, key string) string {
	r := &fleet.Request{Session: []byte(key), HasSession: true, SessionHash: fleet.HashKey([]byte(key))}
	got := routetest.Choose(p, r, 1).Endpoints
	if len(got) == 0 {
		return ""
	}
	return got[0].Name
}

func newSessionPool(t testing.TB, n int) *fleet.Pool {
	return routetest.Pool(t, n, func(p *fleet.Pool) fleet.Policy {
		return NewSessionHash(SessionHashConfig{VNodes: 160, LoadFactor: 1.25, MinInflight: 4}, p, fleet.NewRand(1))
	})
}

// Pinned: a change to hashing or ring layout that would reshuffle every
// live session must fail here.
func TestSessionHashPinned(t *testing.T) {
	if got := fleet.HashKey([]byte("user-42")); got != 0x397e9d3a76af7c81 {
		t.Fatalf("hashKey(user-42) = %#x", got)
	}
	p := newSessionPool(t, 4)
	want := map[string]string{"user-1": "", "user-2": "", "user-3": "", "alpha": "", "beta": ""}
	for k := range want {
		want[k] = sessionPick(p, k)
	}
	pinned := map[string]string{"user-1": "e1", "user-2": "e2", "user-3": "e3", "alpha": "e1", "beta": "e2"}
	for k, v := range pinned {
		if want[k] != v {
			t.Errorf("session %s -> %s, pinned %s", k, want[k], v)
		}
	}
}

func TestSessionHashStability(t *testing.T) {
	const sessions = 4000
	keys := make([]string, sessions)
	for i := range keys {
		keys[i] = fmt.Sprintf("session-%d", i)
	}
	assign := func(p *fleet.Pool) map[string]string {
		m := map[string]string{}
		for _, k := range keys {
			m[k] = sessionPick(p, k)
		}
		return m
	}
	four := assign(newSessionPool(t, 4))
	five := assign(newSessionPool(t, 5)) // e4 added
	moved := 0
	for k, v := range four {
		if five[k] != v {
			moved++
			if five[k] != "e4" {
				t.Fatalf("adding e4 moved %s from %s to %s", k, v, five[k])
			}
		}
	}
	// About 1/5 of sessions should move to the new endpoint.
	if frac := float64(moved) / sessions; frac < 0.12 || frac > 0.28 {
		t.Fatalf("adding 1 of 5 moved %.2f of sessions", frac)
	}
	// Removing e4 again moves only its sessions, back to where they were.
	for k, v := range five {
		if v != "e4" && four[k] != v {
			t.Fatalf("removal moved %s which was not on e4", k)
		}
	}
	// Fair share: every endpoint within 0.5-2x.
	counts := map[string]int{}
	for _, v := range four {
		counts[v]++
	}
	for e, c := range counts {
		if c < sessions/4/2 || c > sessions/4*2 {
			t.Fatalf("%s holds %d sessions", e, c)
		}
	}
}

func TestSessionHashBoundedLoad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		load    int64 // added to the session's home endpoint
		others  int64
		outcome fleet.Outcome
		moved   bool
	}{
		{"home fine", 0, 0, fleet.OutcomeAffinity, false},
		{"below min_inflight never spills", 3, 0, fleet.OutcomeAffinity, false},
		{"over c x avg spills", 20, 2, fleet.OutcomeOverflow, true},
		{"busy but balanced stays", 10, 10, fleet.OutcomeAffinity, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newSessionPool(t, 4)
			home := sessionPick(p, "s1")
			for _, e := range p.Endpoints {
				if e.Name == home {
					e.AddInflight(tc.load)
				} else {
					e.AddInflight(tc.others)
				}
			}
			r := &fleet.Request{Session: []byte("s1"), HasSession: true, SessionHash: fleet.HashKey([]byte("s1"))}
			c := routetest.Choose(p, r, 3)
			got := c.Endpoints
			if (got[0].Name != home) != tc.moved || c.Outcome != tc.outcome {
				t.Fatalf("pick %s (home %s) outcome %v", routetest.Names(got), home, c.Outcome)
			}
			if len(got) != 3 {
				t.Fatalf("want 3 distinct picks, got %s", routetest.Names(got))
			}
		})
	}
}

func TestSessionHashNoSessionFallsBack(t *testing.T) {
	p := newSessionPool(t, 3)
	p.Endpoints[0].AddInflight(50)
	p.Endpoints[1].AddInflight(50)
	r := &fleet.Request{}
	if c := routetest.Choose(p, r, 1); c.Endpoints[0].Name != "e2" || c.Outcome != fleet.OutcomeBalanced {
		t.Fatalf("no-session pick %s outcome %v, want e2 balanced", routetest.Names(c.Endpoints), c.Outcome)
	}
}

func blocksOf(prefix string, n int) []uint64 {
	var h fleet.PrefixHasher
	h.Reset(64, make([]uint64, 0, 4096))
	h.Text([]byte(prefix))
	for i := 0; i < n; i++ {
		h.Text([]byte(fmt.Sprintf("%063d|", i)))
	}
	return h.Out
}

func TestPrefixAffinity(t *testing.T) {
	cfg := DefaultPrefixAffinityConfig()
	cfg.BlockBytes = 64
	cfg.BalanceAbs = 4
	cfg.BalanceRel = 1.5
	sys := string(make([]byte, 64*20)) // 20 shared blocks
	for _, tc := range []struct {
		name     string
		warm     int     // endpoint sent the shared prefix first
		loads    []int64 // then loads
		req      []uint64
		want     string
		outcome  fleet.Outcome
		notWant  string
		minMatch int
	}{
		{"hit goes home", 2, []int64{0, 0, 0, 0}, blocksOf(sys, 2), "e2", fleet.OutcomeAffinity, "", 20},
		{"hit within balance", 2, []int64{1, 1, 4, 1}, blocksOf(sys, 2), "e2", fleet.OutcomeAffinity, "", 20},
		{"home too loaded: least loaded instead", 2, []int64{1, 0, 9, 1}, blocksOf(sys, 2), "e1", fleet.OutcomeOverflow, "e2", 0},
		{"miss goes least loaded, never overloaded", -1, []int64{3, 0, 5, 2}, blocksOf("other", 10), "e1", fleet.OutcomeBalanced, "", 0},
		{"empty prompt balanced", -1, []int64{2, 1, 0, 3}, nil, "e2", fleet.OutcomeBalanced, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pa *PrefixAffinity
			p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { pa = NewPrefixAffinity(cfg, p, fleet.NewRand(5)); return pa })
			if tc.warm >= 0 {
				pa.lrus[tc.warm].insert(blocksOf(sys, 1))
			}
			for i, l := range tc.loads {
				p.Endpoints[i].AddInflight(l)
			}
			r := &fleet.Request{Blocks: tc.req}
			c := routetest.Choose(p, r, 3)
			got := c.Endpoints
			if got[0].Name != tc.want || c.Outcome != tc.outcome || c.Matched < tc.minMatch {
				t.Fatalf("pick %s outcome %v matched %d; want %s %v >=%d", routetest.Names(got), c.Outcome, c.Matched, tc.want, tc.outcome, tc.minMatch)
			}
			if len(tc.req) > 0 && pa.lrus[got[0].Index].matchLen(tc.req) != len(tc.req) {
				t.Fatal("prompt not recorded on the chosen endpoint")
			}
		})
	}
}

func TestBlockLRUEviction(t *testing.T) {
	l := newBlockLRU(16)
	a := blocksOf("a", 10) // 10 blocks
	b := blocksOf("b", 10)
	l.insert(a)
	if l.matchLen(a) != 10 {
		t.Fatal("a not cached")
	}
	l.insert(b) // 20 > 16: a's tail goes first
	if l.Len() != 16 {
		t.Fatalf("len %d, want 16", l.Len())
	}
	if got := l.matchLen(a); got != 6 {
		t.Fatalf("a keeps %d leading blocks, want 6 (tail evicted first)", got)
	}
	if l.matchLen(b) != 10 {
		t.Fatal("b must be fully cached")
	}
	if l.matchLen(blocksOf("c", 3)) != 0 {
		t.Fatal("unknown prefix matched")
	}
}

// prefix-affinity keeps a session on one replica before its prompt has a
// prefix to match, and spreads sessions over replicas.
func TestPrefixAffinitySession(t *testing.T) {
	cfg := DefaultPrefixAffinityConfig()
	p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { return NewPrefixAffinity(cfg, p, fleet.NewRand(9)) })
	homes := map[string]bool{}
	for s := 0; s < 40; s++ {
		key := []byte(fmt.Sprintf("sess-%d", s))
		var home string
		for i := 0; i < 5; i++ {
			r := &fleet.Request{Session: key, HasSession: true, SessionHash: fleet.HashKey(key), Blocks: blocksOf(fmt.Sprintf("turn %d of %d", i, s), 0)}
			got := routetest.Choose(p, r, 1).Endpoints[0].Name
			if home == "" {
				home = got
			} else if got != home {
				t.Fatalf("session %s moved from %s to %s", key, home, got)
			}
		}
		homes[home] = true
	}
	if len(homes) != 4 {
		t.Fatalf("40 sessions used %d replicas", len(homes))
	}
	// A session home above the lowest load is avoided, even by one request
	// (the session only breaks ties): a request with a session id never
	// waits where the same request without one would not.
	key := []byte("sess-0")
	r := &fleet.Request{Session: key, HasSession: true, SessionHash: fleet.HashKey(key)}
	home := routetest.Choose(p, r, 1).Endpoints[0]
	home.AddInflight(1)
	if got := routetest.Choose(p, r, 1).Endpoints[0]; got == home {
		t.Fatal("session kept on a replica above the lowest load")
	}
}

// With scrapes running (tie-break windows started), a conversation's first
// short turns stay on its replica while the load is even, although that
// replica has had more recent decisions than the others (up to
// sessionRecentSlack more); beyond, the session spreads like a request
// without one, which never picks the endpoint with the most recent decisions.
func TestPrefixAffinitySessionStaysAtEvenLoad(t *testing.T) {
	cfg := DefaultPrefixAffinityConfig()
	p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { return NewPrefixAffinity(cfg, p, fleet.NewRand(5)) })
	for _, e := range p.Endpoints {
		e.StartWindow()
	}
	key := []byte("user-7")
	pick := func(session bool) *fleet.Endpoint {
		r := &fleet.Request{Blocks: blocksOf("hi", 0)}
		if session {
			r.Session, r.HasSession, r.SessionHash = key, true, fleet.HashKey(key)
		}
		return routetest.Choose(p, r, 1).Endpoints[0]
	}
	home := pick(true)
	for turn := 2; turn <= sessionRecentSlack+1; turn++ {
		home.State.Decisions.Add(1) // what opening a decision does (then closed: load stays 0)
		if got := pick(true); got != home {
			t.Fatalf("turn %d moved from %s to %s at even load", turn, home.Name, got.Name)
		}
	}
	home.State.Decisions.Add(1)
	if got := pick(true); got == home {
		t.Fatalf("turn %d stayed on %s with %d more recent decisions than the others", sessionRecentSlack+2, home.Name, home.Recent())
	}
	if got := pick(false); got == home {
		t.Fatalf("a request without a session went to %s, the endpoint with the most recent decisions", got.Name)
	}
}

// The session breaks ties among the least loaded only, whatever the load
// source: engine-reported loads count like in-flight decisions.
func TestPrefixAffinitySessionTiesOnly(t *testing.T) {
	cfg := DefaultPrefixAffinityConfig()
	p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { return NewPrefixAffinity(cfg, p, fleet.NewRand(3)) })
	for _, tc := range []struct {
		name   string
		loads  [4]int64
		engine bool
		allow  []string // acceptable picks
	}{
		{"one minimum", [4]int64{3, 2, 0, 5}, false, []string{"e2"}},
		{"two tied", [4]int64{1, 0, 0, 1}, false, []string{"e1", "e2"}},
		{"engine load", [4]int64{0, 7, 7, 7}, true, []string{"e0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, e := range p.Endpoints {
				e.AddInflight(-e.Inflight())
				e.SetEngineLoad(nil)
				if tc.engine {
					// Engine says otherwise than in-flight: the engine wins.
					e.AddInflight(7 - tc.loads[i])
					e.SetEngineLoad(&fleet.EngineLoad{Requests: tc.loads[i], Mark: e.DecisionMark()})
				} else {
					e.AddInflight(tc.loads[i])
				}
			}
			for s := 0; s < 50; s++ {
				key := []byte(fmt.Sprintf("s%d", s))
				r := &fleet.Request{Session: key, HasSession: true, SessionHash: fleet.HashKey(key), Blocks: blocksOf("q", 0)}
				got := routetest.Choose(p, r, 1).Endpoints[0].Name
				if !slices.Contains(tc.allow, got) {
					t.Fatalf("session %s went to %s, want one of %v", key, got, tc.allow)
				}
			}
		})
	}
	for _, e := range p.Endpoints {
		e.SetEngineLoad(nil)
	}
}

// Pinned: prefix block hashes and the rendezvous mix. Changing either
// silently invalidates every replica's learned prefix index and moves
// prefix-affinity sessions, so it must be a deliberate, visible change.
func TestPrefixHashPinned(t *testing.T) {
	var h fleet.PrefixHasher
	h.Reset(16, make([]uint64, 0, 4))
	h.Text([]byte("0123456789abcdef0123456789ABCDEF"))
	got := fmt.Sprintf("%#x,%#x mix=%#x", h.Out[0], h.Out[1], fleet.Mix64(42))
	if want := "0x3f955f4606c2a1bc,0x3e4bcc940fe9ba85 mix=0xa759ea27d4727622"; got != want {
		t.Fatalf("pinned hashes changed: %s", got)
	}
}

// choices: 0 takes the global minimum (P2C may miss it); 2 is P2C.
func TestLeastRequestChoices(t *testing.T) {
	build := func(params string) *fleet.Pool {
		var pc config.PolicyConfig
		if err := yaml.Unmarshal([]byte("name: least-request\nparams: "+params), &pc); err != nil {
			t.Fatal(err)
		}
		return routetest.Pool(t, 8, func(p *fleet.Pool) fleet.Policy {
			pol, err := NewLeastRequestFactory()(&pc, fleet.PolicyEnv{Pool: p, Rand: fleet.NewRand(11)})
			if err != nil {
				t.Fatal(err)
			}
			return pol
		})
	}
	for _, tc := range []struct {
		params    string
		alwaysMin bool
	}{{"{choices: 0}", true}, {"{choices: 2}", false}} {
		p := build(tc.params)
		for i, e := range p.Endpoints {
			e.AddInflight(int64(10 + i)) // e0 is the unique minimum
		}
		hits := 0
		for i := 0; i < 200; i++ {
			if routetest.Choose(p, &fleet.Request{}, 1).Endpoints[0].Name == "e0" {
				hits++
			}
		}
		if tc.alwaysMin != (hits == 200) {
			t.Fatalf("%s: minimum picked %d of 200", tc.params, hits)
		}
	}
	var pc config.PolicyConfig
	_ = yaml.Unmarshal([]byte("name: least-request\nparams: {choices: 3}"), &pc)
	if _, err := NewLeastRequestFactory()(&pc, fleet.PolicyEnv{Pool: &fleet.Pool{}}); err == nil {
		t.Fatal("choices: 3 accepted")
	}
}
