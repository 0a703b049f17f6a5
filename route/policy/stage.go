package policy

import (
	"github.com/turnout/turnout/route/fleet"
	"sync"
)

// A profile is a named run of stages over one pool for one request
// (llm-d's scheduler profile: filters, scorers, a picker); a policy is a
// profile, or a profile handler that picks per request which of its
// profiles runs (session-hash: with a session or without; kv-aware: with
// tokens or prefix-affinity's). "Profile" means this and only this; the
// decision pipeline's serve/prefill picks are passes (route.Pass). Every
// stage is a small interface, shared by the requests of its pool and safe
// for concurrent use; what one decision needs between stages lives in a
// Cycle, taken from a pool, so a decision allocates nothing.

// Cycle is one decision's working state, handed to each stage.
type Cycle struct {
	Req    *fleet.Request
	Pool   *fleet.Pool
	Choice *fleet.Choice
	// Summary of the pool's available endpoints, taken once per decision
	// before the pickers run (see Profile.Summary).
	MinLoad   int64
	TotalLoad int64
	Served    uint64 // summed Endpoint.served, only with Summary.Served
	N         int    // available endpoints
	// Match is, by endpoint index, how many of the request's Of blocks the
	// endpoint holds, and Stale whether that figure is in doubt: set by a
	// policy that looks the request up in an index once (kv-aware), with
	// Held the bits of the endpoints whose Match is not 0.
	Match []int
	Stale []bool
	Held  []uint64
	Of    int
	// MinRecent is the fewest recent decisions among the least loaded
	// (SessionGate, for LeastLoadedRecent).
	MinRecent uint64
	// Cands are the endpoints the stages scan: the pool's, or the
	// candidate set of a pruned decision (prune.go).
	Cands []*fleet.Endpoint
	// start is len(Choice.Endpoints) when the decision began.
	start int
	// candBuf and inSet are the candidate set's memory, kept across
	// decisions.
	candBuf []*fleet.Endpoint
	inSet   []uint64
	// lazy builds Cands when a stage first asks for them.
	lazy *pruning
}

// reset starts the cycle of a decision, keeping the candidate memory.
func (c *Cycle) reset(r *fleet.Request, p *fleet.Pool, ch *fleet.Choice) {
	buf, in := c.candBuf, c.inSet
	*c = Cycle{Req: r, Pool: p, Choice: ch, start: len(ch.Endpoints), candBuf: buf, inSet: in}
}

// Candidates are the endpoints a stage scans: the candidate set of a
// pruned decision, else the pool's.
func (c *Cycle) Candidates() []*fleet.Endpoint {
	if c.Cands != nil {
		return c.Cands
	}
	if pg := c.lazy; pg != nil {
		c.lazy = nil
		if pg.candidates(c) {
			return c.Cands
		}
	}
	return c.Pool.Endpoints
}

// release drops the request's memory while the cycle is idle.
func (c *Cycle) release() {
	c.Req, c.Pool, c.Choice, c.Cands, c.Match, c.Stale, c.Held, c.lazy = nil, nil, nil, nil, nil, nil, nil, nil
}

// Picked is how many endpoints this decision has chosen so far.
func (c *Cycle) Picked() int { return len(c.Choice.Endpoints) - c.start }

// First is the decision's first choice, or nil.
func (c *Cycle) First() *fleet.Endpoint {
	if c.Picked() == 0 {
		return nil
	}
	return c.Choice.Endpoints[c.start]
}

// Usable reports whether a stage may choose e for this request: available
// (healthy, not draining, not stalled) and serving the request's model.
// Every picker asks it, so no policy sends a model where it would 404.
func (c *Cycle) Usable(e *fleet.Endpoint) bool { return e.Available() && c.Req.Only.Has(e.Index) }

// Rotated is Candidates and, with r, a random start among them for a
// scan that wraps around (one draw; none without candidates), so that
// equal endpoints share the picks.
func (c *Cycle) Rotated(r *fleet.Rand) (eps []*fleet.Endpoint, off int) {
	eps = c.Candidates()
	if r != nil && len(eps) > 0 {
		off = r.Intn(len(eps))
	}
	return eps, off
}

// Room reports whether the choice has room for another endpoint.
func (c *Cycle) Room() bool { return len(c.Choice.Endpoints) < cap(c.Choice.Endpoints) }

// Filter keeps the endpoints a picker may choose. Endpoint.Available
// (healthy, not draining, not stalled) is checked before any filter, by
// every picker; filters add conditions of their own (a load guard).
type Filter interface {
	Keep(c *Cycle, e *fleet.Endpoint) bool
	fleet.Consumer
}

// Scorer rates an endpoint for the request: higher is better. A picker
// sums its scorers' scores times their weights; each scorer states its
// unit (blocks, requests) so that weights read as exchange rates.
type Scorer interface {
	Score(c *Cycle, e *fleet.Endpoint) float64
	fleet.Consumer
}

// Tie breaks equal scores: the higher key wins, and when every key is
// equal the first endpoint in the picker's order does.
type Tie interface {
	Key(c *Cycle, e *fleet.Endpoint) uint64
	fleet.Consumer
}

// Picker appends endpoints to the choice (c.Choice.Endpoints, never past
// its capacity), best first, and may set the outcome. A profile runs its
// pickers in order: the first ones place the request, the last fill the
// fallbacks.
type Picker interface {
	Pick(c *Cycle)
	fleet.Consumer
}

// Recorder learns from a decision once the pickers are done (what the
// decision teaches an index: a prefix LRU insert).
type Recorder interface {
	Record(c *Cycle)
	fleet.Consumer
}

// Summary says what a profile summarizes of its pool before its pickers
// run, and whether a pool with nothing available ends the decision there
// with OutcomeNoEndpoint.
type Summary struct {
	// Load takes MinLoad, TotalLoad and N; Served also sums the recent
	// decisions (the bounded-load guard).
	Load, Served bool
	// RequireAvailable: nothing available is OutcomeNoEndpoint, before any
	// picker runs (and draws from a random source).
	RequireAvailable bool
}

// Profile is a run of stages: a summary of the pool, pickers in order,
// then recorders.
type Profile struct {
	Name      string
	Summary   Summary
	Pickers   []Picker
	Recorders []Recorder
	cycles    sync.Pool
	prune     *pruning // nil: the stages scan the whole pool
}

// Pick implements Policy. The Cycle is the caller's (ch.Work, a *Cycle
// from NewWork) when it keeps one, else one from the profile's pool.
func (pr *Profile) Pick(r *fleet.Request, p *fleet.Pool, ch *fleet.Choice) {
	c, _ := ch.Work.(*Cycle)
	pooled := c == nil
	if pooled {
		c, _ = pr.cycles.Get().(*Cycle)
		if c == nil {
			c = &Cycle{}
		}
	}
	c.reset(r, p, ch)
	pr.Run(c)
	c.release()
	if pooled {
		pr.cycles.Put(c)
	}
}

// NewWork is the working memory a caller keeps in a fleet.Choice's Work
// for the composed policies (a pool Get and Put per decision saved).
func NewWork() any { return &Cycle{} }

// Run runs the profile on a cycle the caller filled (Req, Pool, Choice,
// and Match when it has them).
func (pr *Profile) Run(c *Cycle) {
	c.Choice.Outcome = fleet.OutcomeBalanced
	pruned := false
	if pg := pr.prune; pg != nil && pg.applies(c) {
		if pg.lazy {
			c.lazy = pg
		} else {
			pruned = pg.candidates(c)
		}
	}
	if s := pr.Summary; s.Load || s.RequireAvailable {
		if c.lazy != nil {
			// No stage reads MinLoad before the set is built.
			c.lazy.poolSums(c)
		}
		if c.N == 0 {
			c.summarize(s.Served)
		}
		if pruned {
			pr.prune.poolSums(c)
		}
		if s.RequireAvailable && c.N == 0 {
			c.Choice.Outcome = fleet.OutcomeNoEndpoint
			return
		}
	}
	for _, pk := range pr.Pickers {
		pk.Pick(c)
	}
	if c.Picked() > 0 {
		for _, rec := range pr.Recorders {
			rec.Record(c)
		}
	}
}

// summarize takes the load summary of the available candidates in one
// pass.
func (c *Cycle) summarize(withServed bool) {
	for _, e := range c.Candidates() {
		if c.Usable(e) {
			l := e.Load()
			if c.N == 0 || l < c.MinLoad {
				c.MinLoad = l
			}
			c.TotalLoad += l
			if withServed { // only the bounded-load guard reads it
				c.Served += e.Served()
			}
			c.N++
		}
	}
}

var _ fleet.Policy = (*Profile)(nil)
