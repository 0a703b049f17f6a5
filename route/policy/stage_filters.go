package policy

import (
	"github.com/turnout/turnout/route/fleet"
	"math"
)

// LoadGuard is the load guard of every keyed preset, written once:
// SGLang's imbalance test per candidate (more than Abs requests above the
// least loaded and more than Rel times it) and, with Bounded ε > 0, the
// bounded-load test on the requests served lately (here and by peers):
// one more must not put e above ceil((1+ε)·(total+1)/n) (consistent
// hashing with bounded loads, Mirrokni et al.). The bound holds only while
// no replica is idle: refusing a hit then buys no time, and with few
// requests in the window the bound is small enough to move a prefix's
// few sequential turns.
type LoadGuard struct {
	Abs     int64
	Rel     float64
	Bounded float64
}

// Keep implements Filter.
func (g *LoadGuard) Keep(c *Cycle, e *fleet.Endpoint) bool {
	if fleet.TooLoaded(e.Load(), c.MinLoad, g.Abs, g.Rel) {
		return false
	}
	return g.Bounded <= 0 || c.MinLoad < 1 || !overBound(g.Bounded, e.Served(), c.Served, c.N)
}

// overBound is the bounded-load test: would one more request put an
// endpoint that served `served` lately above ceil((1+eps)·(total+1)/n)?
func overBound(eps float64, served, total uint64, n int) bool {
	return float64(served+1) > math.Ceil((1+eps)*float64(total+1)/float64(n))
}

// BoundedServed is the bounded-load half of LoadGuard alone, with a load
// slack: a miss goes to a replica within the bound, at the lowest load or
// at most Slack requests above it where the engine would start it at once
// (Endpoint.Admits). Evening out request counts never queues a request:
// without that test the slack cost p90 TTFT 5 % at 1.6x the Mooncake rate
// and 53 % on the Azure conversations (BENCHMARKS.md).
type BoundedServed struct {
	Eps   float64
	Slack int64
}

// Keep implements Filter.
func (b *BoundedServed) Keep(c *Cycle, e *fleet.Endpoint) bool {
	if l := e.Load(); l > c.MinLoad && (l > c.MinLoad+b.Slack || !e.Admits(l)) {
		return false
	}
	return !overBound(b.Eps, e.Served(), c.Served, c.N)
}

// LeastLoadedRecent keeps the endpoints at the lowest load whose recent
// decisions are within Slack of the fewest among them (its Gate takes that
// figure): a conversation's first turns stay together while the load is
// even, and a busy session still spreads.
type LeastLoadedRecent struct {
	Slack uint64
}

// Keep implements Filter.
func (f *LeastLoadedRecent) Keep(c *Cycle, e *fleet.Endpoint) bool {
	return e.Load() == c.MinLoad && e.Recent() <= c.MinRecent+f.Slack
}

// LoadScore scores -Load (unit: requests): the less loaded, the better.
type LoadScore struct{}

// Score implements Scorer.
func (LoadScore) Score(_ *Cycle, e *fleet.Endpoint) float64 { return -float64(e.Load()) }

// LowerLoad breaks ties toward the less loaded endpoint.
type LowerLoad struct{}

// Key implements Tie: int64 order mapped onto uint64, reversed.
func (LowerLoad) Key(_ *Cycle, e *fleet.Endpoint) uint64 { return ^(uint64(e.Load()) ^ 1<<63) }

// FewerRecent breaks ties toward the endpoint with fewer decisions since
// the last scrape (here and by peers): placements even out request counts
// even when requests finish too fast to show as load.
type FewerRecent struct{}

// Key implements Tie.
func (FewerRecent) Key(_ *Cycle, e *fleet.Endpoint) uint64 { return ^e.Recent() }

// FewerServed breaks ties toward the endpoint that served fewer requests
// over the last one to two windows.
type FewerServed struct{}

// Key implements Tie.
func (FewerServed) Key(_ *Cycle, e *fleet.Endpoint) uint64 { return ^e.Served() }

// SessionRank breaks ties toward the request's session's replica
// (rendezvous hashing: the key is hashed once, mixed per endpoint); a
// request without a session ranks every endpoint equal.
type SessionRank struct{}

// Key implements Tie.
func (SessionRank) Key(c *Cycle, e *fleet.Endpoint) uint64 {
	if !c.Req.HasSession {
		return 0
	}
	return fleet.Mix64(c.Req.SessionHash ^ e.Seed)
}

// CountsGate opens the bounded miss for a request without a session id,
// and for one with a session id only when every usable replica has a
// request: while one is idle nothing queues, so evening out request
// counts buys no time there and would split a session's first turns,
// which the session tie-break keeps together.
type CountsGate struct{}

// Open implements Gate.
func (CountsGate) Open(c *Cycle) bool { return !c.Req.HasSession || c.MinLoad >= 1 }

// MinBlocks opens a picker for prompts of at least N blocks (at least 1).
type MinBlocks struct{ N int }

// Open implements Gate.
func (g *MinBlocks) Open(c *Cycle) bool { return len(c.Req.Blocks) >= max(g.N, 1) }

// SessionGate opens a picker for requests with a session id, and takes
// the fewest recent decisions among the least loaded (LeastLoadedRecent).
type SessionGate struct{}

// Open implements Gate.
func (SessionGate) Open(c *Cycle) bool {
	if !c.Req.HasSession || !c.Room() {
		return false
	}
	found := false
	for _, e := range c.Candidates() {
		if c.Usable(e) && e.Load() == c.MinLoad {
			if rc := e.Recent(); !found || rc < c.MinRecent {
				c.MinRecent, found = rc, true
			}
		}
	}
	return true
}

var (
	_ Filter = (*LoadGuard)(nil)
	_ Gate   = CountsGate{}
	_ Filter = (*BoundedServed)(nil)
	_ Filter = (*LeastLoadedRecent)(nil)
	_ Scorer = LoadScore{}
	_ Tie    = LowerLoad{}
	_ Tie    = FewerRecent{}
	_ Tie    = FewerServed{}
	_ Tie    = SessionRank{}
	_ Gate   = (*MinBlocks)(nil)
	_ Gate   = SessionGate{}
)
