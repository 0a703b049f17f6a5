package flow

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// testPool is a pool of n endpoints with no engine figures: Load is the
// in-flight count.
func testPool(n int) *fleet.Pool {
	p := &fleet.Pool{Name: "p"}
	for i := range n {
		p.Endpoints = append(p.Endpoints, &fleet.Endpoint{Name: "e", Index: i, State: &fleet.State{}})
	}
	return p
}

func testConfig(maxLoad int, mod func(*config.FlowConfig)) *config.FlowConfig {
	f := &config.FlowConfig{Saturation: config.FlowSaturation{MaxLoad: maxLoad}}
	if mod != nil {
		mod(f)
	}
	f.ApplyDefaults()
	return f
}

// harness runs Admit in goroutines and plays the routed request's part:
// a routed request adds its load to endpoint 0, then calls Done.
type harness struct {
	t    *testing.T
	c    *Controller
	p    *fleet.Pool
	outs chan result
}

type result struct {
	name string
	o    Outcome
}

func newHarness(t *testing.T, cfg *config.FlowConfig, n int) *harness {
	p := testPool(n)
	c := New(cfg, p)
	t.Cleanup(c.Close)
	return &harness{t: t, c: c, p: p, outs: make(chan result, 100)}
}

// admit starts a request and waits until it is held (or decided).
func (h *harness) admit(name, class, tenant string, w Watch) {
	h.t.Helper()
	r := &Request{Class: h.c.cfg.ClassIndex(class)}
	if tenant != "" {
		r.setTenant([]byte(tenant), tenantHeader)
	}
	before := h.c.Queued()
	decided := make(chan struct{})
	go func() {
		o := h.c.Admit(r, w)
		if o.Routes() {
			h.p.Endpoints[0].AddInflight(1)
			h.c.Done()
		}
		close(decided)
		h.outs <- result{name, o}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for h.c.Queued() == before {
		select {
		case <-decided:
			return
		default:
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: neither held nor decided", name)
		}
		time.Sleep(time.Millisecond)
	}
}

// free completes one request on endpoint 0 and returns the next decided.
func (h *harness) free() result {
	h.t.Helper()
	h.p.Endpoints[0].AddInflight(-1)
	h.c.Kick()
	return h.next()
}

func (h *harness) next() result {
	h.t.Helper()
	select {
	case r := <-h.outs:
		return r
	case <-time.After(5 * time.Second):
		h.t.Fatal("no request decided")
		return result{}
	}
}

func (h *harness) none() {
	h.t.Helper()
	select {
	case r := <-h.outs:
		h.t.Fatalf("%s decided (%v) while the pool is saturated", r.name, r.o)
	case <-time.After(30 * time.Millisecond):
	}
}

func TestAdmitWhileRoomThenHold(t *testing.T) {
	h := newHarness(t, testConfig(2, nil), 1)
	h.admit("a", "standard", "", nil)
	h.admit("b", "standard", "", nil)
	for range 2 {
		if r := h.next(); r.o != Admitted {
			t.Fatalf("%s: %v, want admitted (room for 2)", r.name, r.o)
		}
	}
	h.admit("c", "standard", "", nil)
	h.none()
	if q := h.c.Queued(); q != 1 {
		t.Fatalf("queued %d, want 1", q)
	}
	if r := h.free(); r.name != "c" || r.o != Released {
		t.Fatalf("got %s %v, want c released", r.name, r.o)
	}
}

// Pending reservations: requests let through but not yet routed count
// against the room, so a burst cannot pass all at once.
func TestPendingCountsAgainstRoom(t *testing.T) {
	c := New(testConfig(2, nil), testPool(1))
	defer c.Close()
	r := &Request{Class: 1}
	for i := range 2 {
		if o := c.Admit(r, nil); o != Admitted {
			t.Fatalf("admit %d: %v", i, o)
		}
	}
	if !c.Saturated() {
		t.Fatal("two requests let through without Done: the pool of max_load 2 must be saturated")
	}
	c.Done()
	if c.Saturated() {
		t.Fatal("after Done with no load on the endpoint there is room")
	}
}

func TestStrictPriority(t *testing.T) {
	h := newHarness(t, testConfig(1, nil), 1)
	h.p.Endpoints[0].AddInflight(1) // saturated
	for _, n := range []string{"s1", "s2", "x1"} {
		h.admit(n, "standard", "", nil)
	}
	h.admit("x-shed", "sheddable", "", nil)
	h.admit("c1", "critical", "", nil)
	want := []string{"c1", "s1", "s2", "x1", "x-shed"}
	for _, w := range want {
		r := h.free()
		if r.name != w || r.o != Released {
			t.Fatalf("released %s (%v), want %s", r.name, r.o, w)
		}
	}
}

func TestTenantsTakeTurns(t *testing.T) {
	h := newHarness(t, testConfig(1, nil), 1)
	h.p.Endpoints[0].AddInflight(1)
	for i := range 10 {
		h.admit("big"+string(rune('0'+i)), "standard", "big", nil)
	}
	h.admit("a", "standard", "small-a", nil)
	h.admit("b", "standard", "small-b", nil)
	var got []string
	for range 12 {
		got = append(got, h.free().name)
	}
	// Round robin: the big tenant's 10 requests do not keep the small ones
	// waiting: each small tenant is served within the first round.
	if strings.Join(got[:3], ",") != "big0,a,b" {
		t.Fatalf("release order %v: want big0,a,b first", got)
	}
	if strings.Join(got[3:], ",") != "big1,big2,big3,big4,big5,big6,big7,big8,big9" {
		t.Fatalf("release order %v: the big tenant's own requests must stay in order", got)
	}
	if n := h.c.Released("standard", "big"); n != 10 {
		t.Fatalf("released metric for big: %d, want 10", n)
	}
}

// A tenant arriving while others are held goes after the tenants not yet
// served at the class's virtual time and before those already served
// (start-time fair queueing): it waits about one release, not a round.
func TestNewTenantJoinsBeforeServedTenants(t *testing.T) {
	h := newHarness(t, testConfig(1, nil), 1)
	h.p.Endpoints[0].AddInflight(1)
	h.admit("a1", "standard", "a", nil)
	h.admit("a2", "standard", "a", nil)
	h.admit("b1", "standard", "b", nil)
	h.admit("b2", "standard", "b", nil)
	if r := h.free(); r.name != "a1" {
		t.Fatalf("got %s, want a1", r.name)
	}
	h.admit("c1", "standard", "c", nil)
	var got []string
	for range 4 {
		got = append(got, h.free().name)
	}
	if strings.Join(got, ",") != "b1,c1,a2,b2" {
		t.Fatalf("order %v, want b1,c1,a2,b2", got)
	}
}

// A tenant that sends its next request as soon as its last is released
// (nothing held in between) gets no more than its turn: every other
// release beside a tenant with many held, not every one.
func TestLeavingAndReturningBuysNothing(t *testing.T) {
	h := newHarness(t, testConfig(1, nil), 1)
	h.p.Endpoints[0].AddInflight(1)
	for i := range 6 {
		h.admit(fmt.Sprint("big", i), "standard", "big", nil)
	}
	h.admit("x0", "standard", "x", nil)
	var got []string
	nx := 0
	for range 6 {
		r := h.free()
		got = append(got, r.name)
		if r.name[0] == 'x' {
			nx++
			h.admit(fmt.Sprint("x", nx), "standard", "x", nil)
		}
	}
	if strings.Join(got, ",") != "big0,x0,big1,x1,big2,x2" {
		t.Fatalf("order %v, want big0,x0,big1,x1,big2,x2", got)
	}
}

// Emptied tenants are remembered only while they are ahead of the virtual
// time, and never more than maxIdle of them: a tenant per request cannot
// grow the queue's memory.
func TestEmptiedTenantsBounded(t *testing.T) {
	q := classQueue{tenants: map[uint64]*tenantQueue{}}
	var w waiter
	for i := range 10 * maxIdle {
		q.push(&w, uint64(i+1))
		if q.pop() != &w {
			t.Fatal("pop did not return the one held request")
		}
	}
	if n := len(q.tenants); n > maxIdle+1 {
		t.Fatalf("%d tenants kept after %d one-request tenants, want at most %d", n, 10*maxIdle, maxIdle+1)
	}
	if q.idle != len(q.tenants) {
		t.Fatalf("idle count %d, tenants kept %d", q.idle, len(q.tenants))
	}
}

func TestBudgets(t *testing.T) {
	cfg := testConfig(1, func(f *config.FlowConfig) {
		f.Classes = []config.FlowClass{
			{Name: "critical", MaxWait: config.Duration(time.Hour)},
			{Name: "standard", MaxWait: config.Duration(40 * time.Millisecond), MaxQueue: 1},
			{Name: "sheddable", MaxWait: config.Duration(40 * time.Millisecond), MaxQueue: 1, Shed: true},
		}
	})
	h := newHarness(t, cfg, 1)
	h.p.Endpoints[0].AddInflight(1)
	h.admit("std", "standard", "", nil)
	h.admit("shed", "sheddable", "", nil)
	// Queues of 1 are full: a second one overflows (routed) or is shed at once.
	h.admit("std-full", "standard", "", nil)
	h.admit("shed-full", "sheddable", "", nil)
	got := map[string]Outcome{}
	for range 4 {
		r := h.next()
		got[r.name] = r.o
	}
	want := map[string]Outcome{"std": TimedOut, "shed": Shed, "std-full": Overflow, "shed-full": Shed}
	for n, o := range want {
		if got[n] != o {
			t.Errorf("%s: %v, want %v", n, got[n], o)
		}
	}
	if q := h.c.Queued(); q != 0 {
		t.Fatalf("queued %d after the budgets ended", q)
	}
}

type flagWatch struct{ gone atomic.Bool }

func (w *flagWatch) Gone() bool { return w.gone.Load() }

func TestGoneClientLeavesQueue(t *testing.T) {
	h := newHarness(t, testConfig(1, nil), 1)
	h.p.Endpoints[0].AddInflight(1)
	w := &flagWatch{}
	h.admit("left", "standard", "", w)
	h.admit("stays", "standard", "", nil)
	w.gone.Store(true)
	if r := h.next(); r.name != "left" || r.o != Gone {
		t.Fatalf("got %s %v, want left gone", r.name, r.o)
	}
	if r := h.free(); r.name != "stays" || r.o != Released {
		t.Fatalf("got %s %v, want stays released", r.name, r.o)
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	p := testPool(1)
	p.Endpoints[0].AddInflight(5)
	c := New(testConfig(1, nil), p)
	outs := make(chan Outcome, 10)
	for range 5 {
		go func() { outs <- c.Admit(&Request{Class: 2}, nil) }()
	}
	for c.Queued() < 5 {
		time.Sleep(time.Millisecond)
	}
	c.Close()
	for range 5 {
		if o := <-outs; o != Released {
			t.Fatalf("closing released a request as %v", o)
		}
	}
	// A closed controller lets everything through.
	if o := c.Admit(&Request{Class: 1}, nil); o != Admitted {
		t.Fatalf("closed controller: %v", o)
	}
}

func TestSaturationThresholds(t *testing.T) {
	p := testPool(2)
	c := New(testConfig(0, func(f *config.FlowConfig) {
		f.Saturation = config.FlowSaturation{MaxWaiting: 2, MaxKVUsage: 0.9}
	}), p)
	defer c.Close()
	if c.Saturated() {
		t.Fatal("no engine figures: max_waiting and KV cannot saturate")
	}
	p.Endpoints[0].SetEngineLoad(&fleet.EngineLoad{Requests: 10, Waiting: 2, KVUsage: 0.5})
	p.Endpoints[1].SetEngineLoad(&fleet.EngineLoad{Requests: 10, Waiting: 0, KVUsage: 0.95})
	if !c.Saturated() {
		t.Fatal("one endpoint at max_waiting, the other over max_kv_usage: saturated")
	}
	p.Endpoints[1].SetEngineLoad(&fleet.EngineLoad{Requests: 10, Waiting: 0, KVUsage: 0.5})
	if c.Saturated() {
		t.Fatal("endpoint 1 has room")
	}
	p.Endpoints[1].AddInflight(2) // two new decisions since the scrape count as waiting
	if !c.Saturated() {
		t.Fatal("in-flight change since the scrape must count")
	}
	p.Endpoints[1].SetDown(true)
	p.Endpoints[1].AddInflight(-2)
	if !c.Saturated() {
		t.Fatal("a down endpoint's room does not count")
	}
	p.Endpoints[0].SetDown(true)
	if c.Saturated() {
		t.Fatal("with no endpoint available nothing may be held: the request must get its no_endpoint answer at once")
	}
}

// A client's own priority and tenant headers count only when the config
// trusts them; an API key names a tenant only through tenant_keys; all
// else shares one tenant.
func TestClassify(t *testing.T) {
	k1 := sha256.Sum256([]byte("Bearer k1"))
	build := func(trust config.FlowTrust) (*Controller, *config.FlowConfig) {
		cfg := testConfig(1, func(f *config.FlowConfig) {
			f.Classes = []config.FlowClass{{Name: "critical", Values: []string{"high", "0"}}, {Name: "standard"}, {Name: "sheddable", Shed: true}}
			f.ModelClasses = map[string]string{"batch-model": "sheddable"}
			f.TenantAPIKey = true
			f.TenantKeys = map[string]string{hex.EncodeToString(k1[:]): "team-a"}
			f.Trust = trust
		})
		c := New(cfg, testPool(1))
		t.Cleanup(c.Close)
		return c, cfg
	}
	trusted, cfgT := build(config.FlowTrust{PriorityHeader: true, TenantHeader: true})
	untrusted, cfgU := build(config.FlowTrust{})
	tests := []struct {
		name   string
		c      *Controller
		cfg    *config.FlowConfig
		model  string
		in     Inputs
		class  string
		tenant string
	}{
		{"default", trusted, cfgT, "m", Inputs{}, "standard", ""},
		{"model default", trusted, cfgT, "batch-model", Inputs{}, "sheddable", ""},
		{"trusted header beats model", trusted, cfgT, "batch-model", Inputs{Priority: []byte("HIGH")}, "critical", ""},
		{"unknown value keeps default", trusted, cfgT, "m", Inputs{Priority: []byte("urgent!")}, "standard", ""},
		{"trusted tenant header", trusted, cfgT, "m", Inputs{Tenant: []byte("acme")}, "standard", "acme"},
		{"listed api key", trusted, cfgT, "m", Inputs{Authorization: []byte("Bearer k1")}, "standard", "team-a"},
		{"trusted header over api key", trusted, cfgT, "m", Inputs{Authorization: []byte("Bearer k1"), Tenant: []byte("acme")}, "standard", "acme"},
		{"untrusted priority ignored", untrusted, cfgU, "batch-model", Inputs{Priority: []byte("critical")}, "sheddable", ""},
		{"untrusted tenant shared", untrusted, cfgU, "m", Inputs{Tenant: []byte("invented-1")}, "standard", ""},
		{"unlisted key shared", untrusted, cfgU, "m", Inputs{Authorization: []byte("Bearer invented")}, "standard", ""},
		{"listed key without trust", untrusted, cfgU, "m", Inputs{Authorization: []byte("Bearer k1"), Tenant: []byte("acme")}, "standard", "team-a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r Request
			tc.c.Classify(&r, []byte(tc.model), &tc.in)
			if got := tc.cfg.Classes[r.Class].Name; got != tc.class {
				t.Errorf("class %s, want %s", got, tc.class)
			}
			if tc.tenant == "" {
				if r.kind != tenantNone || r.Tenant != 0 {
					t.Errorf("tenant %q, want the shared one", r.TenantName)
				}
				return
			}
			if string(r.TenantName) != tc.tenant || r.Tenant != fleet.HashKey([]byte(tc.tenant)) {
				t.Errorf("tenant %q, want %q", r.TenantName, tc.tenant)
			}
		})
	}
}

// Classify runs on the decision path: it must not allocate.
func TestClassifyAllocs(t *testing.T) {
	k1 := sha256.Sum256([]byte("Bearer k1"))
	c := New(testConfig(1, func(f *config.FlowConfig) {
		f.TenantAPIKey = true
		f.TenantKeys = map[string]string{hex.EncodeToString(k1[:]): "team-a"}
		f.ModelClasses = map[string]string{"m": "sheddable"}
		f.Trust.PriorityHeader = true
	}), testPool(1))
	defer c.Close()
	in := Inputs{Priority: []byte("critical"), Authorization: []byte("Bearer k1")}
	model := []byte("m")
	var r Request
	if n := testing.AllocsPerRun(100, func() { c.Classify(&r, model, &in) }); n != 0 {
		t.Fatalf("%v allocations per Classify", n)
	}
}

func TestTenantLabelsBounded(t *testing.T) {
	c := New(testConfig(100, func(f *config.FlowConfig) { f.MaxTenantLabels = 2 }), testPool(1))
	defer c.Close()
	for _, tn := range []string{"a", "b\"\n\x00x", "c", "d"} {
		r := &Request{Class: 1}
		r.setTenant([]byte(tn), tenantHeader)
		c.Admit(r, nil)
		c.Done()
	}
	var b strings.Builder
	s := NewSet()
	s.byDep["dep"] = c
	s.WriteMetrics(&b)
	out := b.String()
	for _, want := range []string{`tenant="a",outcome="admitted"} 1`, `tenant="b___x",outcome="admitted"} 1`, `class="standard",tenant="other",outcome="admitted"} 2`} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(out, `tenant="c"`) {
		t.Error("tenant c has its own label past max_tenant_labels 2")
	}
	if strings.Count(out, "# TYPE turnout_flow_requests_total") != 1 {
		t.Error("a family's TYPE line must appear once")
	}
}

// A class's headroom is a reserve lower classes never fill: with the pool
// at max_load a critical request still goes on at once, while standard ones
// are held; past the headroom critical is held too, and released first.
func TestHeadroomReservesForHigherClass(t *testing.T) {
	cfg := testConfig(1, func(f *config.FlowConfig) {
		f.Classes = []config.FlowClass{{Name: "critical", Headroom: 1}, {Name: "standard"}, {Name: "sheddable", Shed: true}}
	})
	h := newHarness(t, cfg, 1)
	h.p.Endpoints[0].AddInflight(1) // at max_load
	h.admit("s1", "standard", "", nil)
	h.none()
	h.admit("c1", "critical", "", nil)
	if r := h.next(); r.name != "c1" || r.o != Admitted {
		t.Fatalf("got %s %v, want c1 admitted into the headroom", r.name, r.o)
	}
	h.admit("c2", "critical", "", nil) // load 2 = max_load + headroom
	h.none()
	if r := h.free(); r.name != "c2" || r.o != Released {
		t.Fatalf("got %s %v, want c2 released first", r.name, r.o)
	}
	h.none() // load 2 again: no room for standard (max_load 1)
	h.p.Endpoints[0].AddInflight(-1)
	if r := h.free(); r.name != "s1" || r.o != Released {
		t.Fatalf("got %s %v, want s1 released once under max_load", r.name, r.o)
	}
}

// Held requests count against the set's byte budget: one that would pass
// it is not held but shed (a shedding class) or routed at once; what a
// held request took is given back when it leaves the queue.
func TestHeldBytesBudget(t *testing.T) {
	s := NewSet()
	defer s.Close()
	s.SetMaxBytes(100)
	p := testPool(1)
	c := s.Bind("d", testConfig(1, nil), p)
	p.Endpoints[0].AddInflight(1) // saturated
	std, shed := c.cfg.ClassIndex("standard"), c.cfg.ClassIndex("sheddable")
	held := make(chan Outcome, 1)
	go func() { held <- c.Admit(&Request{Class: std, Bytes: 60}, nil) }()
	deadline := time.Now().Add(5 * time.Second)
	for c.Queued() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first request was not held")
		}
		time.Sleep(time.Millisecond)
	}
	if got := s.HeldBytes(); got != 60 {
		t.Fatalf("held bytes %d, want 60", got)
	}
	if o := c.Admit(&Request{Class: std, Bytes: 60}, nil); o != Overflow {
		t.Fatalf("standard past the budget: %v, want overflow (routed at once)", o)
	}
	c.Done()
	if o := c.Admit(&Request{Class: shed, Bytes: 60}, nil); o != Shed {
		t.Fatalf("sheddable past the budget: %v, want shed", o)
	}
	p.Endpoints[0].AddInflight(-1)
	c.Kick()
	if o := <-held; o != Released {
		t.Fatalf("the held request: %v, want released", o)
	}
	c.Done()
	if got := s.HeldBytes(); got != 0 {
		t.Fatalf("held bytes %d after the queue emptied, want 0", got)
	}
}
