package policy

import (
	"fmt"

	"github.com/turnout/turnout/route/fleet"
)

// PrefixAffinityType is the registry name of PrefixAffinity.
const PrefixAffinityType = "prefix-affinity"

// PrefixAffinityConfig are the params of prefix-affinity.
//
// Algorithm (per request, over available endpoints):
//  1. Load is Endpoint.Load: the engine-reported running + waiting requests
//     plus this instance's decisions since the scrape (in-flight decisions
//     when no engine figure is known). A candidate e is "too loaded" when
//     load(e)-min > BalanceAbs && load(e) > BalanceRel*min (SGLang's
//     imbalance test, applied per candidate rather than pool-wide), or,
//     with BoundedLoad ε > 0 and no replica idle, when one more request
//     would put the requests it served lately (here and by peers,
//     Endpoint.served) above ceil((1+ε)·(total+1)/n) (consistent
//     hashing with bounded loads, Mirrokni et al., with request counts as
//     the load).
//  2. Among candidates that are not too loaded, take the longest cached
//     prefix (ties: the replica that last got that prefix, here or from a
//     peer; then lower load, then the session's replica). If
//     matched/total >= MatchThreshold, route there.
//  3. Otherwise the least-loaded endpoint. A session id only chooses among
//     the endpoints tied at the lowest load (rendezvous hash; at most
//     sessionRecentSlack recent decisions ahead of the least used), so a
//     conversation's first turns land together while their prefix is too
//     short to match, and a request with a session id never waits where the
//     same request without one would not (spilling sessions onto
//     replicas up to BalanceAbs above the minimum cost p90 TTFT). Unlike
//     SGLang's "smallest tree", a miss never lands on an overloaded replica.
//     With BoundedLoad ε > 0 (and, for a request with a session id, no
//     replica idle), a miss instead goes to the replica that served the
//     fewest requests lately among those within the bound, at the lowest
//     load or at most missLoadSlack above it where the engine would start
//     it at once (no waiting request at the last scrape, load below what it
//     ran when it last queued: Endpoint.Admits).
//  4. Record the prompt's blocks in the chosen endpoint's index.
type PrefixAffinityConfig struct {
	BlockBytes     int     `yaml:"block_bytes"`
	CapacityBlocks int     `yaml:"capacity_blocks"` // per endpoint
	MatchThreshold float64 `yaml:"match_threshold"`
	BalanceAbs     int64   `yaml:"balance_abs"`
	BalanceRel     float64 `yaml:"balance_rel"`
	// BoundedLoad is ε of the bounded-load guard (default 1.1; 0: off):
	// while no replica is idle, no replica gets more than about (1+ε)
	// times the mean of the requests every instance sent lately, and a
	// miss goes to the replica that served the fewest where that queues
	// nothing (a miss without a session id at any load). The guards above
	// compare loads, which are small integers that scrapes and other
	// fronts blur, and a load-balanced placement still leaves request
	// counts 5-15 % apart when prefixes draw several turns each (with 2
	// and 4 fronts, against a goal of requests max/mean ≤ 1.05). With an
	// idle replica nothing queues, so it
	// leaves hits and a session's misses alone: a session's first turns
	// stay together (BENCHMARKS.md, "Even request counts").
	BoundedLoad float64 `yaml:"bounded_load"`
	// MinBlocks: prompts shorter than this many blocks are load balanced.
	MinBlocks int `yaml:"min_blocks"`
	// SessionAffinity: a session id breaks ties on a miss (its hashed
	// replica among the least loaded; with BoundedLoad, among those that
	// served the fewest), never overrides load.
	SessionAffinity bool `yaml:"session_affinity"`
}

// Validate checks the params.
func (c *PrefixAffinityConfig) Validate() error {
	switch {
	case c.BlockBytes < 16 || c.BlockBytes > fleet.MaxBlockBytes:
		return fmt.Errorf("prefix-affinity block_bytes %d out of range [16, %d]", c.BlockBytes, fleet.MaxBlockBytes)
	case c.CapacityBlocks < 16 || c.CapacityBlocks > 1<<24:
		return fmt.Errorf("prefix-affinity capacity_blocks %d out of range [16, 16M]", c.CapacityBlocks)
	case c.MatchThreshold < 0 || c.MatchThreshold > 1:
		return fmt.Errorf("prefix-affinity match_threshold %v out of range [0, 1]", c.MatchThreshold)
	case c.BalanceAbs < 0:
		return fmt.Errorf("prefix-affinity balance_abs must be >= 0")
	case c.BalanceRel < 1:
		return fmt.Errorf("prefix-affinity balance_rel %v must be >= 1", c.BalanceRel)
	case c.MinBlocks < 0:
		return fmt.Errorf("prefix-affinity min_blocks must be >= 0")
	case c.BoundedLoad < 0 || c.BoundedLoad > 100:
		return fmt.Errorf("prefix-affinity bounded_load %v out of range [0, 100] (0: off)", c.BoundedLoad)
	}
	return nil
}

// DefaultPrefixAffinityConfig returns the defaults.
func DefaultPrefixAffinityConfig() PrefixAffinityConfig {
	return PrefixAffinityConfig{
		BlockBytes: 256, CapacityBlocks: 131072, MatchThreshold: 0.3,
		BalanceAbs: 4, BalanceRel: 1.5, BoundedLoad: 1.1, MinBlocks: 1, SessionAffinity: true,
	}
}

// PrefixAffinity routes requests sharing a prompt prefix to the replica that
// was last sent that prefix, guarded by load.
//
// Preset, pickers in order: the prefix hit (keyed on the prefix index,
// LoadGuard, ties: LastSent, lower load, the session's replica), the bounded
// miss (bounded_load > 0; CountsGate), the session tie-break
// (session_affinity), the least-loaded fill; the prefix index records the
// first choice.
type PrefixAffinity struct {
	Profile
	cfg   PrefixAffinityConfig
	idx   *PrefixIndex
	lrus  []*blockLRU // by endpoint index, shared with idx
	names []string
}

// NewPrefixAffinityFactory returns the factory for prefix-affinity.
func NewPrefixAffinityFactory() Factory {
	return configured(DefaultPrefixAffinityConfig, func(cfg PrefixAffinityConfig, env fleet.PolicyEnv) fleet.Policy {
		return NewPrefixAffinity(cfg, env.Pool, env.Rand)
	})
}

// NewPrefixAffinity builds the policy for pool p.
func NewPrefixAffinity(cfg PrefixAffinityConfig, p *fleet.Pool, rnd *fleet.Rand) *PrefixAffinity {
	if rnd == nil {
		rnd = fleet.NewRand(1)
	}
	pa := &PrefixAffinity{cfg: cfg}
	pa.idx = newPrefixIndex(cfg.BlockBytes, cfg.CapacityBlocks, p)
	pa.idx.last = newLastSent(len(p.Endpoints), cfg.CapacityBlocks)
	pa.lrus, pa.names = pa.idx.lrus, pa.idx.names
	var session []Tie
	if cfg.SessionAffinity {
		session = []Tie{SessionRank{}}
	}
	pa.Profile = Profile{
		Name:    PrefixAffinityType,
		Summary: Summary{Load: true, Served: cfg.BoundedLoad > 0, RequireAvailable: true},
		Pickers: []Picker{&MaxScore{
			Name: "prefix-hit", Gate: &MinBlocks{N: cfg.MinBlocks}, Key: pa.idx, Accept: cfg.MatchThreshold,
			Filters: []Filter{&LoadGuard{Abs: cfg.BalanceAbs, Rel: cfg.BalanceRel, Bounded: cfg.BoundedLoad}},
			Ties:    append([]Tie{LastSent{X: pa.idx}, LowerLoad{}}, session...),
			Slots:   1, SetsOutcome: true, OnPick: true, Outcome: fleet.OutcomeAffinity,
		}},
		Recorders: []Recorder{pa.idx},
	}
	if cfg.BoundedLoad > 0 {
		// A miss starts a prefix that draws its later turns to the same
		// replica: place it on the replica that served the fewest requests
		// lately (with a session id, only while none is idle), among those
		// within the bound and at the lowest load or at most missLoadSlack
		// above it where it would not queue, so replicas that served more
		// than their share get fewer new prefixes.
		pa.Pickers = append(pa.Pickers, &MaxScore{
			Name: "bounded-miss", Gate: CountsGate{}, Filters: []Filter{&BoundedServed{Eps: cfg.BoundedLoad, Slack: missLoadSlack}},
			Ties: append([]Tie{FewerServed{}, LowerLoad{}}, session...),
			Rand: rnd, Slots: 1, WhenEmpty: true,
		})
	}
	if cfg.SessionAffinity {
		// Among the endpoints tied at the lowest load whose recent
		// decisions are within sessionRecentSlack of the fewest: a
		// conversation's first turns stay together while the load is even.
		pa.Pickers = append(pa.Pickers, &MaxScore{
			Name: "session-tie", Gate: SessionGate{}, Filters: []Filter{&LeastLoadedRecent{Slack: sessionRecentSlack}},
			Ties:  session,
			Slots: 1, WhenEmpty: true, SetsOutcome: true, OnPick: true, Upgrade: true, Outcome: fleet.OutcomeAffinity,
		})
	}
	pa.Pickers = append(pa.Pickers, NewLeastLoaded(rnd))
	return pa
}

// BlockBytes implements PromptUser.
func (pa *PrefixAffinity) BlockBytes() int { return pa.cfg.BlockBytes }

// Carry implements Stater: surviving endpoints keep their index when the
// block size and capacity did not change.
func (pa *PrefixAffinity) Carry(prev fleet.Policy) {
	if old, ok := prev.(*PrefixAffinity); ok {
		pa.idx.carry(old.idx)
	}
}

// Forget empties the index of the endpoint at index i (tests: pools do not
// share an index).
func (pa *PrefixAffinity) Forget(i int) {
	pa.idx.heads.clear(int32(i))
	pa.lrus[i] = newBlockLRU(pa.cfg.CapacityBlocks)
	pa.idx.heads.bind(pa.lrus[i], int32(i))
}

// CachedBlocks reports the index size of the endpoint at index i (metrics, tests).
func (pa *PrefixAffinity) CachedBlocks(i int) int { return pa.lrus[i].Len() }

// missLoadSlack: with the bounded-load guard on, a miss goes to the replica
// that served the fewest requests lately among those at most this far above
// the lowest load. 1 absorbs the requests other fronts sent since the last
// scrape, which this instance cannot see in the load figure: with 0, two
// fronts gave requests max/mean 1.16-1.19 on the e2e replay (BENCHMARKS.md).
const missLoadSlack = 1

// sessionRecentSlack is how many more recent decisions (since the last
// scrape window started) a session's replica may have than the least used
// of the endpoints tied at the lowest load and still get the session's next
// miss: a conversation's first few turns land together. Swept on the
// Mooncake sim (BENCHMARKS.md, sessions): 0 moved sessions on every turn
// and cost p50 TTFT at load; 2 and 3 left requests max/mean or p90 above
// the no-session runs at 2x rate; no bound unbalanced requests (1.14) at
// the trace's rate; 4 stays inside the no-session spread at both rates.
const sessionRecentSlack = 4

// PrefixIndex is the approximate prefix index of prefix-affinity: per
// endpoint, an LRU of the block hashes it was sent. As a Keyer it gives the
// cached prefix length; as a Recorder it inserts the prompt's blocks into
// the first choice's LRU.
type PrefixIndex struct {
	blockBytes, capacity int
	lrus                 []*blockLRU // by endpoint index
	names                []string    // by endpoint index
	heads                *headIndex  // which endpoints hold each prompt's first block
	last                 *lastSent   // which endpoint got each prompt last; nil: not kept
}

// newPrefixIndex is an empty index for pool p's endpoints.
func newPrefixIndex(blockBytes, capacity int, p *fleet.Pool) *PrefixIndex {
	x := &PrefixIndex{blockBytes: blockBytes, capacity: capacity, heads: newHeadIndex(len(p.Endpoints))}
	for i, e := range p.Endpoints {
		l := newBlockLRU(capacity)
		x.heads.bind(l, int32(i))
		x.lrus = append(x.lrus, l)
		x.names = append(x.names, e.Name)
	}
	return x
}

// carry keeps the LRUs of surviving endpoints when the block size and
// capacity did not change (else the hashes mean other things); they report
// their first blocks to this index from now on. The last-sent table starts
// empty: it names endpoints by their index, which a reload may change.
func (x *PrefixIndex) carry(old *PrefixIndex) {
	if old == nil || old.blockBytes != x.blockBytes || old.capacity != x.capacity {
		return
	}
	for i, n := range x.names {
		for j, on := range old.names {
			if on == n {
				x.heads.clear(int32(i))
				x.lrus[i] = old.lrus[j]
				x.heads.bind(x.lrus[i], int32(i))
			}
		}
	}
}

// recordAt marks blocks as sent to the endpoint at index i.
func (x *PrefixIndex) recordAt(i int, blocks []uint64) {
	if i >= 0 && i < len(x.lrus) {
		x.lrus[i].insert(blocks)
		x.sent(i, blocks)
	}
}

// Match implements Keyer.
func (x *PrefixIndex) Match(c *Cycle, e *fleet.Endpoint) int {
	return x.lrus[e.Index].matchLen(c.Req.Blocks)
}

// Of implements Keyer.
func (x *PrefixIndex) Of(c *Cycle) int { return len(c.Req.Blocks) }

// Holders sets in dst (bits by endpoint index) the endpoints that can
// match any of the prompt: only those holding its first block; false when
// it cannot tell (no blocks, dst too short) and every endpoint is asked.
func (x *PrefixIndex) Holders(c *Cycle, dst []uint64) bool {
	if len(c.Req.Blocks) == 0 || len(dst) < x.heads.words {
		return false
	}
	if !x.heads.holders(c.Req.Blocks[0], dst) {
		clear(dst[:x.heads.words])
	}
	return true
}

// Record implements Recorder.
func (x *PrefixIndex) Record(c *Cycle) {
	i := c.First().Index
	x.lrus[i].insert(c.Req.Blocks)
	x.sent(i, c.Req.Blocks)
}

// sent notes endpoint i as the last to get the prompt that ends in
// blocks' last block.
func (x *PrefixIndex) sent(i int, blocks []uint64) {
	if x.last != nil && len(blocks) > 0 {
		x.last.put(blocks[len(blocks)-1], i)
	}
}

var (
	_ Keyer            = (*PrefixIndex)(nil)
	_ Recorder         = (*PrefixIndex)(nil)
	_ fleet.Policy     = (*PrefixAffinity)(nil)
	_ fleet.PromptUser = (*PrefixAffinity)(nil)
	_ fleet.Stater     = (*PrefixAffinity)(nil)
)

// LoadAware implements LoadAware: the balance guard reads in-flight counts.
func (*PrefixAffinity) LoadAware() bool { return true }

// RecordPrefix implements PrefixRecorder.
func (pa *PrefixAffinity) RecordPrefix(i int, blocks []uint64) { pa.idx.recordAt(i, blocks) }

var (
	_ fleet.LoadAware      = (*PrefixAffinity)(nil)
	_ fleet.PrefixRecorder = (*PrefixAffinity)(nil)
)
