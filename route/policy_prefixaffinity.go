package route

import "fmt"

// PrefixAffinityType is the registry name of PrefixAffinity.
const PrefixAffinityType = "prefix-affinity"

// PrefixAffinityConfig are the params of prefix-affinity.
//
// Algorithm (per request, over available endpoints):
//  1. Load is in-flight decisions. A candidate e is "too loaded" when
//     load(e)-min > BalanceAbs && load(e) > BalanceRel*min (SGLang's
//     imbalance test, applied per candidate rather than pool-wide).
//  2. Among candidates that are not too loaded, take the longest cached
//     prefix (ties: lower load). If matched/total >= MatchThreshold, route there.
//  3. Otherwise, a request with a session id goes to the session's replica
//     (rendezvous hash over the candidates that are not too loaded), so a
//     conversation's first turns stick before its prefix is long enough to
//     match; without a session, to the least-loaded endpoint (random
//     tie-break). Unlike SGLang's "smallest tree", a miss never lands on an
//     overloaded replica.
//  4. Record the prompt's blocks in the chosen endpoint's index.
type PrefixAffinityConfig struct {
	BlockBytes     int     `yaml:"block_bytes"`
	CapacityBlocks int     `yaml:"capacity_blocks"` // per endpoint
	MatchThreshold float64 `yaml:"match_threshold"`
	BalanceAbs     int64   `yaml:"balance_abs"`
	BalanceRel     float64 `yaml:"balance_rel"`
	// MinBlocks: prompts shorter than this many blocks are load balanced.
	MinBlocks int `yaml:"min_blocks"`
	// SessionAffinity: on a miss, keep a session on its hashed replica.
	SessionAffinity bool `yaml:"session_affinity"`
}

// Validate checks the params.
func (c *PrefixAffinityConfig) Validate() error {
	switch {
	case c.BlockBytes < 16 || c.BlockBytes > MaxBlockBytes:
		return fmt.Errorf("prefix-affinity block_bytes %d out of range [16, %d]", c.BlockBytes, MaxBlockBytes)
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
	}
	return nil
}

// DefaultPrefixAffinityConfig returns the defaults.
func DefaultPrefixAffinityConfig() PrefixAffinityConfig {
	return PrefixAffinityConfig{
		BlockBytes: 256, CapacityBlocks: 131072, MatchThreshold: 0.3,
		BalanceAbs: 4, BalanceRel: 1.5, MinBlocks: 1, SessionAffinity: true,
	}
}

// PrefixAffinity routes requests sharing a prompt prefix to the replica that
// was last sent that prefix, guarded by load.
type PrefixAffinity struct {
	cfg   PrefixAffinityConfig
	rnd   *Rand
	lrus  []*blockLRU // by endpoint index
	names []string
}

// NewPrefixAffinityFactory returns the factory for prefix-affinity.
func NewPrefixAffinityFactory() Factory {
	return func(pc *PolicyConfig, env PolicyEnv) (Policy, error) {
		cfg := DefaultPrefixAffinityConfig()
		if err := pc.DecodeParams(&cfg); err != nil {
			return nil, err
		}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return NewPrefixAffinity(cfg, env.Pool, env.Rand), nil
	}
}

// NewPrefixAffinity builds the policy for pool p.
func NewPrefixAffinity(cfg PrefixAffinityConfig, p *Pool, rnd *Rand) *PrefixAffinity {
	if rnd == nil {
		rnd = NewRand(1)
	}
	pa := &PrefixAffinity{cfg: cfg, rnd: rnd}
	for _, e := range p.Endpoints {
		pa.lrus = append(pa.lrus, newBlockLRU(cfg.CapacityBlocks))
		pa.names = append(pa.names, e.Name)
	}
	return pa
}

// BlockBytes implements PromptUser.
func (pa *PrefixAffinity) BlockBytes() int { return pa.cfg.BlockBytes }

// Carry implements Stater: surviving endpoints keep their index when the
// block size and capacity did not change (else the hashes mean other things).
func (pa *PrefixAffinity) Carry(prev Policy) {
	old, ok := prev.(*PrefixAffinity)
	if !ok || old.cfg.BlockBytes != pa.cfg.BlockBytes || old.cfg.CapacityBlocks != pa.cfg.CapacityBlocks {
		return
	}
	for i, n := range pa.names {
		for j, on := range old.names {
			if on == n {
				pa.lrus[i] = old.lrus[j]
			}
		}
	}
}

// CachedBlocks reports the index size of the endpoint at index i (metrics, tests).
func (pa *PrefixAffinity) CachedBlocks(i int) int { return pa.lrus[i].Len() }

// Pick implements Policy.
func (pa *PrefixAffinity) Pick(r *Request, p *Pool, dst []*Endpoint) []*Endpoint {
	start := len(dst)
	minLoad, ok := minInflight(p)
	if !ok {
		r.Outcome = OutcomeNoEndpoint
		return dst
	}
	if len(r.Blocks) < max(pa.cfg.MinBlocks, 1) {
		return pa.miss(r, p, dst, minLoad, false)
	}
	var best *Endpoint
	bestMatch, bestLoad := 0, int64(0)
	overloadedHit := false
	for i, e := range p.Endpoints {
		if !e.Available() {
			continue
		}
		m := pa.lrus[i].matchLen(r.Blocks)
		if m == 0 {
			continue
		}
		l := e.Inflight()
		if pa.tooLoaded(l, minLoad) {
			overloadedHit = overloadedHit || m*2 >= len(r.Blocks)
			continue
		}
		if m > bestMatch || (m == bestMatch && l < bestLoad) {
			best, bestMatch, bestLoad = e, m, l
		}
	}
	r.Matched = bestMatch
	if best != nil && float64(bestMatch) >= pa.cfg.MatchThreshold*float64(len(r.Blocks)) {
		dst = append(dst, best)
		r.Outcome = OutcomeAffinity
		dst = fillLeastLoaded(dst, p, pa.rnd)
	} else {
		r.Matched = 0
		dst = pa.miss(r, p, dst, minLoad, overloadedHit)
	}
	if len(dst) > start {
		pa.lrus[dst[start].Index].insert(r.Blocks)
	}
	return dst
}

// miss places a request without a usable prefix match: on its session's
// replica when it has a session, else on the least loaded.
func (pa *PrefixAffinity) miss(r *Request, p *Pool, dst []*Endpoint, minLoad int64, overloadedHit bool) []*Endpoint {
	r.Outcome = OutcomeBalanced
	if overloadedHit {
		r.Outcome = OutcomeOverflow
	}
	if pa.cfg.SessionAffinity && r.HasSession {
		var best *Endpoint
		var bestScore uint64
		for _, e := range p.Endpoints {
			if !e.Available() || contains(dst, e) || pa.tooLoaded(e.Inflight(), minLoad) {
				continue
			}
			// Rendezvous hashing: the key is hashed once, mixed per endpoint.
			if s := mix64(r.SessionHash ^ e.Seed); best == nil || s > bestScore {
				best, bestScore = e, s
			}
		}
		if best != nil {
			dst = append(dst, best)
			if !overloadedHit {
				r.Outcome = OutcomeAffinity
			}
		}
	}
	return fillLeastLoaded(dst, p, pa.rnd)
}

func (pa *PrefixAffinity) tooLoaded(load, minLoad int64) bool {
	return tooLoaded(load, minLoad, pa.cfg.BalanceAbs, pa.cfg.BalanceRel)
}

var (
	_ Policy     = (*PrefixAffinity)(nil)
	_ PromptUser = (*PrefixAffinity)(nil)
	_ Stater     = (*PrefixAffinity)(nil)
)
