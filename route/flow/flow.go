// Package flow is flow control for one deployment: while the
// serving pool is saturated, decisions are held in turnout instead of being
// committed to a replica's queue at once, ordered by class (strict
// priority) and tenant (fair queueing within a class), and released one by
// one as capacity frees, each then routed by the deployment's policy at
// release time (so it goes to the replica that is free, or holds its
// prefix, then: "no-regret" routing). A request held past its class's
// max_wait is shed (429) if its class sheds, else routed at once; a
// request whose client went away is dropped from the queue.
//
// The proxy waits for turnout's answer meanwhile (the SPOE processing
// timeout, the Lua and nginx call timeouts grow with the longest max_wait:
// config.RouteCallTimeout). turnout's death answers nothing, and the
// proxies' fail mode applies as for any dead turnout.
//
// A Controller is built per deployment by a Set, which keeps it across
// config reloads while its config is unchanged.
package flow

import (
	"math"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Outcome is what Admit decided.
type Outcome uint8

// Outcomes; the routed ones need Done once routed.
const (
	// Admitted: the pool had room, nothing was queued; routed at once.
	Admitted Outcome = iota
	// Released: held, then released as capacity freed.
	Released
	// Overflow: the class's queue was full and the class does not shed:
	// routed at once.
	Overflow
	// TimedOut: held for max_wait in a class that does not shed: routed.
	TimedOut
	// Shed: refused (429 + Retry-After): queue full or past max_wait.
	Shed
	// Gone: the client went away while held; nothing to answer.
	Gone
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"admitted", "released", "overflow", "timed_out", "shed", "gone"}

func (o Outcome) String() string { return outcomeNames[o] }

// Routes reports whether the request goes on to the policy (and Done must follow).
func (o Outcome) Routes() bool { return o <= TimedOut }

// Watch tells whether the client of a held request went away; the
// transport provides it (nil: never known).
type Watch interface{ Gone() bool }

// pollEvery is how often a held request checks its Watch and deadline, and
// the release loop re-reads the pool's load while requests are held (a
// scrape may have freed room without any completion).
const pollEvery = 5 * time.Millisecond

// watchEvery is how often a held request asks its Watch (a syscall).
const watchEvery = 50 * time.Millisecond

// Controller holds, orders and releases one deployment's decisions.
type Controller struct {
	cfg *config.FlowConfig
	// defClass is the default class's index; keys the tenant_keys.
	defClass int
	keys     tenantKeys
	// budget is the Set's bound on the bytes held (nil: unbounded).
	budget *budget

	mu   sync.Mutex
	pool *fleet.Pool
	// classes are the queues, highest priority first.
	classes []classQueue
	queued  int
	// pending counts requests let through and not yet routed: their load
	// is not on any endpoint yet, so it is taken from the room.
	pending int64
	closed  bool

	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	waiters sync.Pool
	m       *metrics
	// slo counts the outcomes of requests with an objective, by class (slo.go).
	slo []sloCounts
}

// New returns a running controller for pool; Close stops it.
func New(cfg *config.FlowConfig, pool *fleet.Pool) *Controller {
	c := &Controller{
		cfg:      cfg,
		defClass: cfg.ClassIndex(cfg.DefaultClass),
		keys:     newTenantKeys(cfg),
		pool:     pool,
		classes:  make([]classQueue, len(cfg.Classes)),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		m:        newMetrics(cfg),
		slo:      make([]sloCounts, len(cfg.Classes)),
	}
	for i := range c.classes {
		c.classes[i].tenants = map[uint64]*tenantQueue{}
	}
	c.waiters.New = func() any { return &waiter{ch: make(chan struct{}, 1)} }
	go c.loop()
	return c
}

// Config is the flow config the controller runs.
func (c *Controller) Config() *config.FlowConfig { return c.cfg }

// SetPool points the controller at a new snapshot's pool.
func (c *Controller) SetPool(p *fleet.Pool) {
	c.mu.Lock()
	c.pool = p
	c.mu.Unlock()
	c.Kick()
}

// Kick wakes the release loop: capacity may have freed (a completion).
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Close stops the controller; held requests are released to be routed
// (a reload that drops or changes flow control loses none).
func (c *Controller) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for i := range c.classes {
		for w := c.next(i); w != nil; w = c.next(i) {
			c.releaseLocked(w)
		}
	}
	c.mu.Unlock()
	close(c.stop)
	<-c.done
}

// room is how many more requests the pool takes before it is saturated:
// the sum over available endpoints of what each has left under the
// thresholds, less the requests let through and not yet routed; unbounded
// when no endpoint is available. Called under mu.
func (c *Controller) room(class int) int64 {
	s := &c.cfg.Saturation
	hr := int64(c.cfg.Classes[class].Headroom)
	var r int64
	avail := false
	for _, e := range c.pool.Endpoints {
		if !e.Available() {
			continue
		}
		avail = true
		er := int64(math.MaxInt32)
		if s.MaxLoad > 0 {
			er = min(er, int64(s.MaxLoad)+hr-e.Load())
		}
		if s.MaxWaiting > 0 {
			if w, ok := e.Waiting(); ok {
				er = min(er, int64(s.MaxWaiting)+hr-w)
			}
		}
		if s.MaxKVUsage > 0 {
			if el := e.Engine(); el != nil && el.KVUsage >= s.MaxKVUsage {
				er = 0
			}
		}
		if er > 0 {
			r += er
		}
	}
	if !avail {
		// Nothing to wait for: the policy answers no_endpoint at once and
		// the proxy applies its fail mode.
		return math.MaxInt32
	}
	return r - c.pending
}

// Saturated reports whether the pool has no room for the lowest class
// (whose headroom is the smallest).
func (c *Controller) Saturated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.room(len(c.classes)-1) <= 0
}

// queuedUpTo is how many requests of class i and above are held. Under mu.
func (c *Controller) queuedUpTo(i int) int {
	n := 0
	for j := 0; j <= i; j++ {
		n += c.classes[j].n
	}
	return n
}

// Queued is the number of requests held.
func (c *Controller) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queued
}

// Admit decides whether r goes on now, waits for room, or is refused;
// it blocks while the request is held. A routed Outcome must be followed
// by Done once the request's decision is open (or refused).
func (c *Controller) Admit(r *Request, watch Watch) Outcome {
	cl := &c.cfg.Classes[r.Class]
	c.mu.Lock()
	// Nothing of its class or above is held and it has room: it goes on
	// (lower classes may be held: strict priority, and a class's headroom).
	if c.closed || (c.queuedUpTo(r.Class) == 0 && c.room(r.Class) > 0) {
		c.pending++
		c.mu.Unlock()
		c.m.count(r, Admitted)
		return Admitted
	}
	q := &c.classes[r.Class]
	if q.n >= cl.MaxQueue || !c.budget.take(r.Bytes) {
		if cl.Shed {
			c.mu.Unlock()
			c.m.count(r, Shed)
			return Shed
		}
		c.pending++
		c.mu.Unlock()
		c.m.count(r, Overflow)
		return Overflow
	}
	w := c.waiters.Get().(*waiter)
	w.class, w.at, w.state = r.Class, time.Now(), stateQueued
	q.push(w, r.Tenant)
	c.queued++
	c.m.queued(r, 1)
	c.mu.Unlock()
	c.Kick()
	o := c.wait(w, cl, watch)
	c.budget.give(r.Bytes)
	c.m.queued(r, -1)
	c.m.count(r, o)
	if o != Gone && o != Shed {
		c.m.waited(r.Class, time.Since(w.at))
	}
	c.waiters.Put(w)
	return o
}

// wait blocks until w is released, its budget ends or its client goes.
func (c *Controller) wait(w *waiter, cl *config.FlowClass, watch Watch) Outcome {
	deadline := w.at.Add(cl.MaxWait.D())
	t := time.NewTimer(pollEvery)
	defer t.Stop()
	nextWatch := w.at.Add(watchEvery)
	for {
		select {
		case <-w.ch:
			return Released
		case <-t.C:
		}
		now := time.Now()
		gone := false
		if watch != nil && !now.Before(nextWatch) {
			gone, nextWatch = watch.Gone(), now.Add(watchEvery)
		}
		if !gone && now.Before(deadline) {
			t.Reset(min(pollEvery, deadline.Sub(now)))
			continue
		}
		c.mu.Lock()
		if w.state == stateReleased {
			c.mu.Unlock()
			<-w.ch
			if gone {
				c.Done() // its room goes back
				return Gone
			}
			return Released
		}
		c.classes[w.class].remove(w)
		c.queued--
		switch {
		case gone:
			c.mu.Unlock()
			return Gone
		case cl.Shed:
			c.mu.Unlock()
			return Shed
		}
		c.pending++
		c.mu.Unlock()
		return TimedOut
	}
}

// Done ends the reservation of a routed request: its decision is open (its
// load is on the endpoint now) or it was refused.
func (c *Controller) Done() {
	c.mu.Lock()
	c.pending--
	c.mu.Unlock()
	c.Kick()
}

// loop releases held requests while the pool has room, woken by Admit,
// Done, completions (Kick) and, while anything is held, every pollEvery.
func (c *Controller) loop() {
	defer close(c.done)
	t := time.NewTimer(pollEvery)
	t.Stop()
	for {
		var tick <-chan time.Time
		if c.release() > 0 {
			t.Reset(pollEvery)
			tick = t.C
		}
		select {
		case <-c.kick:
		case <-tick:
		case <-c.stop:
			t.Stop()
			return
		}
	}
}

// release lets held requests go, highest class first, while there is room;
// it returns how many stay held. A lower class never goes before a held
// higher one: its headroom is no larger, so it has no room either.
func (c *Controller) release() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.queued > 0 {
		i := 0
		for c.classes[i].n == 0 {
			i++
		}
		if c.room(i) <= 0 {
			break
		}
		c.releaseLocked(c.next(i))
	}
	return c.queued
}

// next pops class i's next request: its tenants take turns. Under mu.
func (c *Controller) next(i int) *waiter {
	w := c.classes[i].pop()
	if w != nil {
		c.queued--
	}
	return w
}

// releaseLocked hands w its turn; its room is reserved until Done.
func (c *Controller) releaseLocked(w *waiter) {
	w.state = stateReleased
	c.pending++
	w.ch <- struct{}{}
}
