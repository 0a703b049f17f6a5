package discovery

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
)

// fakeSource is a Source whose endpoints the test sets.
type fakeSource struct {
	mu       sync.Mutex
	eps      map[string][]config.EndpointConfig
	vanished map[string]bool
	synced   bool
	notify   func()
}

func (f *fakeSource) Configure(*config.Config) error { return nil }
func (f *fakeSource) Endpoints() map[string][]config.EndpointConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]config.EndpointConfig{}
	for k, v := range f.eps {
		out[k] = append([]config.EndpointConfig(nil), v...)
	}
	return out
}
func (f *fakeSource) Vanished() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for k, v := range f.vanished {
		out[k] = v
	}
	return out
}
func (f *fakeSource) Synced() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.synced }
func (f *fakeSource) set(synced bool, pool string, eps ...config.EndpointConfig) {
	f.mu.Lock()
	f.synced = synced
	if pool != "" {
		f.eps[pool] = eps
		delete(f.vanished, pool)
	}
	f.mu.Unlock()
	f.notify()
}

// vanish deletes every slice of pool (as opposed to slices listing nothing).
func (f *fakeSource) vanish(pool string) {
	f.mu.Lock()
	f.eps[pool] = []config.EndpointConfig{}
	f.vanished[pool] = true
	f.mu.Unlock()
	f.notify()
}

func ep(name, addr string, draining bool) config.EndpointConfig {
	return config.EndpointConfig{Name: name, Address: addr, Draining: draining, Discovered: true}
}

const fleetYAML = `
haproxy: {drain_timeout: 400ms}
deployments:
  - name: chat
    pools:
      - role: mixed
        endpoints: [{name: m-0, address: 127.0.0.1:9001}]
  - name: pd
    pools:
      - role: prefill
        endpoints: [{name: p-0, address: 127.0.0.1:9002}]
      - role: decode
        discovery: {kubernetes: {service: vllm, port: http, vanish_grace: 500ms}}
`

// applied records what the fleet applied.
type applied struct {
	mu     sync.Mutex
	cfgs   []*config.Config
	syncs  []bool
	drains []time.Duration
}

func (a *applied) apply(c *config.Config, synced bool, drain time.Duration) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cfgs = append(a.cfgs, c)
	a.syncs = append(a.syncs, synced)
	a.drains = append(a.drains, drain)
	return nil
}

func (a *applied) lastDrain() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.drains[len(a.drains)-1]
}

func (a *applied) n() int { a.mu.Lock(); defer a.mu.Unlock(); return len(a.cfgs) }

// decode renders the last applied decode pool as "name[*draining] ...".
func (a *applied) decode() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cfgs) == 0 {
		return ""
	}
	var b []string
	for _, e := range a.cfgs[len(a.cfgs)-1].Deployments[1].Pools[1].Endpoints {
		s := e.Name
		if e.Draining {
			s += "*"
		}
		b = append(b, s)
	}
	return strings.Join(b, " ")
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func startFleet(t *testing.T, inflight func(pool, name string) int64) (*fakeSource, *applied) {
	t.Helper()
	src, a, _ := startFleetF(t, inflight)
	return src, a
}

func startFleetF(t *testing.T, inflight func(pool, name string) int64) (*fakeSource, *applied, *Fleet) {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(fleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{eps: map[string][]config.EndpointConfig{}, vanished: map[string]bool{}}
	a := &applied{}
	f := New(Options{Apply: a.apply, Inflight: inflight, Window: 30 * time.Millisecond,
		NewSource: func(notify func()) (Source, error) { src.notify = notify; return src, nil }})
	if err := f.SetBase(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go f.Run(ctx)
	return src, a, f
}

// Until the source has listed once, the pool is empty and applies say
// "not synced" (the proxies are left alone); a burst is one swap.
func TestFleetSyncAndBurst(t *testing.T) {
	src, a := startFleet(t, nil)
	if a.n() != 1 || a.syncs[0] || a.decode() != "" {
		t.Fatalf("first apply: n=%d synced=%v decode=%q, want one unsynced apply with an empty pool", a.n(), a.syncs, a.decode())
	}
	// 50 notifications in a burst: one merged apply.
	for i := range 50 {
		eps := []config.EndpointConfig{}
		for j := 0; j <= i%3; j++ {
			eps = append(eps, ep("d-"+string(rune('0'+j)), "10.0.0."+string(rune('1'+j))+":8000", false))
		}
		src.set(true, "pd_decode", eps...)
	}
	waitFor(t, "the burst applied", func() bool { return a.n() >= 2 })
	time.Sleep(100 * time.Millisecond)
	if a.n() != 2 {
		t.Errorf("%d applies after a burst of 50 changes, want 1 more", a.n()-1)
	}
	if !a.syncs[1] || a.decode() != "d-0 d-1" {
		t.Errorf("after the burst: synced=%v decode=%q, want synced and the burst's last state", a.syncs[1], a.decode())
	}
	// Static pools are untouched.
	if got := a.cfgs[1].Deployments[0].Pools[0].Endpoints; len(got) != 1 || got[0].Name != "m-0" {
		t.Errorf("static pool changed: %+v", got)
	}
}

// An endpoint that leaves its slice stays, draining, while decisions are in
// flight; it goes when they are done, or at haproxy.drain_timeout.
func TestFleetDrainsLeftovers(t *testing.T) {
	var busy atomic.Int64 // in-flight decisions of d-1
	busy.Store(2)
	src, a := startFleet(t, func(pool, name string) int64 {
		if name == "d-1" {
			return busy.Load()
		}
		return 0
	})
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("d-1", "10.0.0.2:8000", false), ep("d-2", "10.0.0.3:8000", false))
	waitFor(t, "three decode endpoints", func() bool { return a.decode() == "d-0 d-1 d-2" })

	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false))
	// d-2 had nothing in flight: gone at once; d-1 is kept draining.
	waitFor(t, "d-1 draining, d-2 gone", func() bool { return a.decode() == "d-0 d-1*" })
	busy.Store(0)
	waitFor(t, "d-1 removed once its decisions completed", func() bool { return a.decode() == "d-0" })

	// The drain timeout bounds the wait even if feedback never comes.
	busy.Store(5)
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("d-1", "10.0.0.2:8000", false))
	waitFor(t, "d-1 back", func() bool { return a.decode() == "d-0 d-1" })
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false))
	waitFor(t, "d-1 draining again", func() bool { return a.decode() == "d-0 d-1*" })
	start := time.Now()
	waitFor(t, "d-1 removed at the drain timeout", func() bool { return a.decode() == "d-0" })
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("d-1 removed after %v with decisions in flight, before the 400ms drain timeout", d)
	}
}

// A terminating pod (draining in the slice) and a name clash with a static
// endpoint: the clash gets a stable hashed name.
func TestFleetDrainingAndNames(t *testing.T) {
	src, a := startFleet(t, nil)
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("p-0", "10.0.0.9:8000", true))
	waitFor(t, "two endpoints", func() bool { return strings.Count(a.decode(), " ") == 1 })
	got := a.decode()
	if !strings.HasPrefix(got, "d-0 ") || strings.Contains(got, "p-0 ") || !strings.HasSuffix(got, "*") {
		t.Fatalf("decode pool %q: want d-0 and a renamed, draining p-0", got)
	}
	first := got
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("p-0", "10.0.0.9:8000", false))
	waitFor(t, "p-0 ready", func() bool { return !strings.Contains(a.decode(), "*") })
	if strings.TrimSuffix(first, "*") != a.decode() {
		t.Errorf("renamed endpoint not stable: %q then %q", first, a.decode())
	}
}

// A pool whose slices all vanish keeps its last endpoints (available, not
// draining), says so in a metric and a readiness line, and follows the
// slices again when they return; after the grace they leave. Slices that
// list no ready endpoint empty the pool at once.
func TestFleetVanishGrace(t *testing.T) {
	src, a, f := startFleetF(t, nil)
	held := func() string {
		var b strings.Builder
		f.WriteMetrics(&b)
		for line := range strings.Lines(b.String()) {
			if strings.HasPrefix(line, `turnout_discovery_held_endpoints{deployment="pd",pool="pd_decode"}`) {
				return strings.TrimSpace(line[strings.LastIndexByte(line, ' ')+1:])
			}
		}
		return "missing"
	}
	ready := func() string { var b strings.Builder; f.WriteReadiness(&b); return b.String() }
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("d-1", "10.0.0.2:8000", false))
	waitFor(t, "two endpoints", func() bool { return a.decode() == "d-0 d-1" })
	if held() != "0" || ready() != "" {
		t.Fatalf("before: held %s, readiness %q", held(), ready())
	}

	src.vanish("pd_decode")
	time.Sleep(150 * time.Millisecond) // several windows and ticks
	if got := a.decode(); got != "d-0 d-1" {
		t.Fatalf("slices vanished: pool %q, want the last known d-0 d-1 kept", got)
	}
	if held() != "2" || !strings.Contains(ready(), "pool pd_decode: every EndpointSlice vanished") || !strings.Contains(ready(), "d-0,d-1") {
		t.Errorf("while held: metric %s, readiness %q", held(), ready())
	}
	// Re-created with one pod renamed: the kept set is replaced.
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("d-2", "10.0.0.3:8000", false))
	waitFor(t, "the re-created slices followed", func() bool { return a.decode() == "d-0 d-2" })
	if held() != "0" || ready() != "" {
		t.Errorf("after: held %s, readiness %q", held(), ready())
	}

	// Gone for longer than the grace (500ms): the endpoints leave.
	src.vanish("pd_decode")
	start := time.Now()
	waitFor(t, "the pool emptied after the grace", func() bool { return a.decode() == "" })
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Errorf("kept endpoints left after %v, before the 500ms grace", d)
	}
	time.Sleep(100 * time.Millisecond)
	if a.decode() != "" || held() != "0" {
		t.Errorf("after the grace: pool %q held %s, want empty (no second hold)", a.decode(), held())
	}

	// Slices that exist but list no ready endpoint: empty at once.
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false))
	waitFor(t, "d-0 back", func() bool { return a.decode() == "d-0" })
	src.set(true, "pd_decode")
	waitFor(t, "no ready endpoint: empty", func() bool { return a.decode() == "" })
}

// The fleet's own merges tell the proxies how long they may still wait for
// a removed server: nothing after an expired drain (the fleet waited the
// whole drain_timeout already), a short grace after the decisions all
// completed, the full drain_timeout for a new base (static endpoints).
func TestFleetDrainOwed(t *testing.T) {
	var busy atomic.Int64
	src, a, f := startFleetF(t, func(_, name string) int64 {
		if name == "d-1" {
			return busy.Load()
		}
		return 0
	})
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("d-1", "10.0.0.2:8000", false))
	waitFor(t, "two endpoints", func() bool { return a.decode() == "d-0 d-1" })
	if d := a.lastDrain(); d != 400*time.Millisecond {
		t.Errorf("the first synced merge owes %v, want haproxy.drain_timeout (400ms): the proxies may hold servers from before", d)
	}

	busy.Store(3)
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false))
	waitFor(t, "d-1 draining", func() bool { return a.decode() == "d-0 d-1*" })
	waitFor(t, "d-1 dropped at the drain timeout", func() bool { return a.decode() == "d-0" })
	if d := a.lastDrain(); d != 0 {
		t.Errorf("after an expired drain the proxies may wait %v more, want 0", d)
	}

	busy.Store(0)
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false), ep("d-1", "10.0.0.2:8000", false))
	waitFor(t, "d-1 back", func() bool { return a.decode() == "d-0 d-1" })
	src.set(true, "pd_decode", ep("d-0", "10.0.0.1:8000", false))
	waitFor(t, "d-1 dropped, decisions done", func() bool { return a.decode() == "d-0" })
	if d := a.lastDrain(); d <= 0 || d > drainGrace {
		t.Errorf("after a completed drain the proxies may wait %v, want (0, %v]", d, drainGrace)
	}

	cfg, err := config.ParseConfig([]byte(fleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetBase(cfg); err != nil {
		t.Fatal(err)
	}
	if d := a.lastDrain(); d != 400*time.Millisecond {
		t.Errorf("a new base owes %v, want haproxy.drain_timeout (400ms)", d)
	}
}
