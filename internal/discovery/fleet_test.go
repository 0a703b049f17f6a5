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
	mu     sync.Mutex
	eps    map[string][]config.EndpointConfig
	synced bool
	notify func()
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
func (f *fakeSource) Synced() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.synced }
func (f *fakeSource) set(synced bool, pool string, eps ...config.EndpointConfig) {
	f.mu.Lock()
	f.synced = synced
	if pool != "" {
		f.eps[pool] = eps
	}
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
        discovery: {kubernetes: {service: vllm, port: http}}
`

// applied records what the fleet applied.
type applied struct {
	mu    sync.Mutex
	cfgs  []*config.Config
	syncs []bool
}

func (a *applied) apply(c *config.Config, synced bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cfgs = append(a.cfgs, c)
	a.syncs = append(a.syncs, synced)
	return nil
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
	cfg, err := config.ParseConfig([]byte(fleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{eps: map[string][]config.EndpointConfig{}}
	a := &applied{}
	f := New(Options{Apply: a.apply, Inflight: inflight, Window: 30 * time.Millisecond,
		NewSource: func(notify func()) (Source, error) { src.notify = notify; return src, nil }})
	if err := f.SetBase(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go f.Run(ctx)
	return src, a
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
