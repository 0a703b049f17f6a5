package policy

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/route/fleet"
)

// Candidate pruning: above max_candidates endpoints, a decision's stages
// scan a candidate set instead of the whole pool. The set is the
// request's key holders (the prefix index's holders of the prompt's first
// block, the endpoints whose KV events hold its blocks), the least loaded
// endpoints of the pool's candidate index and a few sampled at random;
// the pool-wide figures a guard compares against (the number of available
// endpoints, their total load and recent requests) come from the same
// index. The stages themselves are unchanged: a pool of at most
// max_candidates endpoints decides exactly as without pruning.

// CandidateIndex is one pool's load-ordered candidate set and its running
// sums, maintained by a rolling pass over the pool: each decision that
// finds the pass free scans the next chunk, so a full pass takes about
// passDecisions decisions (or less time than passMaxAge) and no decision
// scans the whole pool. What a pass found is published entry by entry
// (atomics: a decision may read a mix of two passes' entries, every one an
// endpoint of the pool) and allocation-free.
type CandidateIndex struct {
	eps     []*fleet.Endpoint
	least   []atomic.Pointer[fleet.Endpoint] // the least loaded at the last pass, ascending
	sampled int                              // endpoints drawn at random per decision
	keys    int                              // most key holders per decision
	chunk   int                              // endpoints scanned per decision
	size    int                              // max_candidates
	rand    *fleet.Rand
	clock   fleet.Clock
	// The last full pass's sums over the available endpoints.
	n      atomic.Int64
	total  atomic.Int64
	served atomic.Uint64
	done   atomic.Int64 // the clock's time when the last pass ended
	ended  atomic.Bool  // a pass ended (done is set)

	mu   sync.Mutex // the pass in progress, below
	pos  int        // endpoints scanned in this pass
	off  int        // where this pass started (random: ties spread)
	top  []ranked   // the least loaded so far, ascending
	pn   int64
	ptot int64
	psrv uint64
}

// ranked is an endpoint with its figures when the pass scanned it.
type ranked struct {
	e      *fleet.Endpoint
	load   int64
	recent uint64
}

// passDecisions is how many decisions a pass spreads over: between passes
// the least loaded entries take about that many requests among them, so
// it is kept at a fraction of their number.
const passDecisions = 32

// passMaxAge bounds a pass's age when decisions are rare: a decision that
// finds the last pass older finishes the current one itself.
const passMaxAge = 5 * time.Millisecond

// NewCandidateIndex is the candidate index of pool p for sets of about
// maxCandidates endpoints: half the least loaded, up to half key holders,
// an eighth sampled; clock times its passes (nil: the wall clock).
func NewCandidateIndex(p *fleet.Pool, maxCandidates int, rnd *fleet.Rand, clock fleet.Clock) *CandidateIndex {
	k := max(1, maxCandidates/2)
	if rnd == nil {
		rnd = fleet.NewRand(uint64(len(p.Endpoints)))
	}
	return &CandidateIndex{
		eps: p.Endpoints, least: make([]atomic.Pointer[fleet.Endpoint], k), top: make([]ranked, 0, k),
		sampled: max(1, maxCandidates/8), keys: max(1, maxCandidates/2),
		chunk: (len(p.Endpoints) + passDecisions - 1) / passDecisions, size: maxCandidates, rand: rnd,
		clock: fleet.ClockOr(clock),
	}
}

// advance scans the next chunk of the pass when no other decision is, the
// rest of it when the last pass is too old or none ended yet.
func (x *CandidateIndex) advance() {
	if !x.mu.TryLock() {
		return
	}
	n := x.chunk
	if !x.ended.Load() || x.clock.Now()-x.done.Load() > int64(passMaxAge) {
		n = len(x.eps)
	}
	x.scan(n)
	x.mu.Unlock()
}

// scan takes up to n more endpoints into the pass, and publishes it when it
// has seen every endpoint. Under mu.
func (x *CandidateIndex) scan(n int) {
	eps := x.eps
	if x.pos == 0 {
		x.off, x.top, x.pn, x.ptot, x.psrv = x.rand.Intn(len(eps)), x.top[:0], 0, 0, 0
	}
	for ; n > 0 && x.pos < len(eps); n, x.pos = n-1, x.pos+1 {
		i := x.pos + x.off
		if i >= len(eps) {
			i -= len(eps)
		}
		e := eps[i]
		if !e.Available() {
			continue
		}
		r := ranked{e: e, load: e.Load(), recent: e.Recent()}
		x.pn++
		x.ptot += r.load
		x.psrv += e.Served()
		x.insert(r)
	}
	if x.pos < len(eps) {
		return
	}
	for i := range x.least {
		var e *fleet.Endpoint
		if i < len(x.top) {
			e = x.top[i].e
		}
		x.least[i].Store(e)
	}
	x.n.Store(x.pn)
	x.total.Store(x.ptot)
	x.served.Store(x.psrv)
	x.done.Store(x.clock.Now())
	x.ended.Store(true)
	x.pos = 0
}

// insert keeps r among the least loaded (then fewest recent) when it is.
func (x *CandidateIndex) insert(r ranked) {
	less := func(a, b *ranked) bool { return a.load < b.load || a.load == b.load && a.recent < b.recent }
	k := cap(x.top)
	if len(x.top) == k {
		if !less(&r, &x.top[k-1]) {
			return
		}
		x.top = x.top[:k-1]
	}
	j := len(x.top)
	x.top = x.top[:j+1]
	for ; j > 0 && less(&r, &x.top[j-1]); j-- {
		x.top[j] = x.top[j-1]
	}
	x.top[j] = r
}

// candidateKeyer is a stage that can name the endpoints a request's key
// makes candidates (its holders), adding at most budget of them with
// c.addCandidate; false when it cannot tell, and the pool is scanned.
type candidateKeyer interface {
	keyCandidates(c *Cycle, budget int) bool
}

// keyCandidates implements candidateKeyer: the endpoints holding the
// prompt's first block (the only ones that can match).
func (x *PrefixIndex) keyCandidates(c *Cycle, budget int) bool {
	if len(c.Req.Blocks) == 0 {
		return true
	}
	var h [maxHolderWords]uint64
	if !x.Holders(c, h[:]) {
		return false
	}
	words := x.heads.words
	start := int(c.Req.Blocks[0] % uint64(words)) // holders past budget: not always the same ones
	for j := range words {
		w := start + j
		if w >= words {
			w -= words
		}
		if !addHolders(c, w, h[w], &budget) {
			return true
		}
	}
	return true
}

// keyCandidates implements candidateKeyer: the endpoints whose KV events
// hold any of the request's blocks.
func (kvUncached) keyCandidates(c *Cycle, budget int) bool {
	for w, b := range c.Held {
		if !addHolders(c, w, b, &budget) {
			return true
		}
	}
	return true
}

// addHolders adds the endpoints of bitset word w (bit i: endpoint
// w*64+i) as candidates while budget lasts; false once it ran out.
func addHolders(c *Cycle, w int, b uint64, budget *int) bool {
	for ; b != 0; b &= b - 1 {
		if *budget == 0 {
			return false
		}
		i := w<<6 | bits.TrailingZeros64(b)
		if i < len(c.Pool.Endpoints) && c.addCandidate(c.Pool.Endpoints[i]) {
			*budget--
		}
	}
	return true
}

// keyCandidates implements candidateKeyer: which endpoints hold an
// adapter is not indexed, so an adapter request scans the pool.
func (x *LoRAIndex) keyCandidates(c *Cycle, _ int) bool { return !c.Req.Adapter }

// pruning is what a profile prunes with: the pool's index and the stages
// that name key candidates. lazy: only a last-resort fill scans, so the
// set is built when it runs, and the summary is the index's alone.
type pruning struct {
	x      *CandidateIndex
	keyers []candidateKeyer
	lazy   bool
}

// applies reports whether the decision prunes (the request may go to any
// endpoint of the pool the index was built for), and advances the pass.
func (pg *pruning) applies(c *Cycle) bool {
	if c.Req.Only != nil || len(c.Pool.Endpoints) != len(pg.x.eps) {
		return false
	}
	pg.x.advance()
	return true
}

// candidates fills c.Cands with the pruned set and reports true, or leaves
// the pool's endpoints there and reports false (a keyer cannot tell,
// nothing in the set is available).
func (pg *pruning) candidates(c *Cycle) bool {
	x := pg.x
	c.startCandidates(len(x.least) + x.keys + x.sampled)
	budget := x.keys
	for _, k := range pg.keyers {
		before := len(c.Cands)
		if !k.keyCandidates(c, budget) {
			c.Cands = c.Pool.Endpoints
			return false
		}
		budget -= len(c.Cands) - before
	}
	for i := range x.least {
		if e := x.least[i].Load(); e != nil {
			c.addCandidate(e)
		}
	}
	for range x.sampled {
		c.addCandidate(x.eps[x.rand.Intn(len(x.eps))])
	}
	if len(c.Cands) == 0 {
		c.Cands = c.Pool.Endpoints
		return false
	}
	return true
}

// poolSums replaces the candidate set's sums with the pool's, from the
// index's last pass (MinLoad stays the set's: it holds the least loaded).
func (pg *pruning) poolSums(c *Cycle) {
	c.N = max(c.N, int(pg.x.n.Load()))
	c.TotalLoad = max(c.TotalLoad, pg.x.total.Load())
	c.Served = max(c.Served, pg.x.served.Load())
}

// startCandidates empties the candidate buffer (room for n) and the
// set-membership bits for the cycle's pool.
func (c *Cycle) startCandidates(n int) {
	if cap(c.candBuf) < n {
		c.candBuf = make([]*fleet.Endpoint, 0, n)
	}
	if w := (len(c.Pool.Endpoints) + 63) / 64; cap(c.inSet) < w {
		c.inSet = make([]uint64, w)
	} else {
		c.inSet = c.inSet[:w]
		clear(c.inSet)
	}
	c.Cands = c.candBuf[:0]
}

// addCandidate adds e to the set when it is usable and not in it yet.
func (c *Cycle) addCandidate(e *fleet.Endpoint) bool {
	i := e.Index
	if c.inSet[i>>6]&(1<<(i&63)) != 0 || len(c.Cands) == cap(c.Cands) || !c.Usable(e) {
		return false
	}
	c.inSet[i>>6] |= 1 << (i & 63)
	c.Cands = append(c.Cands, e)
	return true
}

// prunable is a policy whose stages can scan a candidate set.
type prunable interface {
	usePruning(x *CandidateIndex)
}

// applyPruning gives policy p, built for env's pool, a candidate index when
// the pool has more than maxCandidates endpoints and p's stages allow it.
func applyPruning(p fleet.Policy, env *fleet.PolicyEnv, maxCandidates int) {
	pool := env.Pool
	if pool == nil || maxCandidates <= 0 || len(pool.Endpoints) <= maxCandidates {
		return
	}
	if pp, ok := p.(prunable); ok {
		pp.usePruning(NewCandidateIndex(pool, maxCandidates, env.Rand, env.Clock))
	}
}

// usePruning implements prunable: when every picker is a known stage and
// one of them scans the pool.
func (pr *Profile) usePruning(x *CandidateIndex) {
	var keyers []candidateKeyer
	if ok, scans, eager := stagesKeyers(pr.Pickers, &keyers); ok && scans {
		pr.prune = &pruning{x: x, keyers: keyers, lazy: !eager}
	}
}

func (s *SessionHash) usePruning(x *CandidateIndex) {
	s.session.usePruning(x)
	s.fallback.usePruning(x)
}

func (k *KVAware) usePruning(x *CandidateIndex) {
	k.profile.usePruning(x)
	k.fallback.usePruning(x)
	k.probes = x.size
}

// stagesKeyers collects the keyers of pickers; ok is false when a picker
// or a scorer is one pruning does not know (it might rank by something the
// candidate set leaves out), scans whether any picker scans the pool,
// eager whether one does on every decision (not only as a last resort).
func stagesKeyers(pickers []Picker, keyers *[]candidateKeyer) (ok, scans, eager bool) {
	for _, pk := range pickers {
		var m *MaxScore
		switch p := pk.(type) {
		case *MaxScore:
			m = p
		case *prefixMatched:
			m = p.MaxScore
		case *kvRank:
			m = &p.MaxScore
		case firstOnly:
			o, s, e := stagesKeyers([]Picker{p.Picker}, keyers)
			if !o {
				return false, false, false
			}
			scans, eager = scans || s, eager || e
		case *LeastLoaded:
			scans, eager = true, eager || !p.WhenEmpty
		case *ttftGuard:
			scans, eager = true, true
		case *P2C, *Rotation, *Ring:
		default:
			return false, false, false
		}
		if m == nil {
			continue
		}
		scans, eager = true, true
		if k, isKey := m.Key.(candidateKeyer); isKey {
			addKeyer(keyers, k)
		} else if m.Key != nil {
			return false, false, false
		}
		for _, w := range m.Scorers {
			switch sc := w.Scorer.(type) {
			case candidateKeyer:
				addKeyer(keyers, sc)
			case LoadScore, EngineQueue:
			default:
				return false, false, false
			}
		}
	}
	return true, scans, eager
}

func addKeyer(keyers *[]candidateKeyer, k candidateKeyer) {
	for _, have := range *keyers {
		if have == k {
			return
		}
	}
	*keyers = append(*keyers, k)
}

var (
	_ candidateKeyer = (*PrefixIndex)(nil)
	_ candidateKeyer = kvUncached{}
	_ candidateKeyer = (*LoRAIndex)(nil)
	_ prunable       = (*Profile)(nil)
	_ prunable       = (*SessionHash)(nil)
	_ prunable       = (*KVAware)(nil)
)
