package policy

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"

	"github.com/cespare/xxhash/v2"
)

// SessionHashType is the registry name of SessionHash.
const SessionHashType = "session-hash"

// SessionHashConfig are the params of session-hash.
type SessionHashConfig struct {
	// VNodes is the number of ring points per endpoint.
	VNodes int `yaml:"vnodes"`
	// LoadFactor c: an endpoint above c x average in-flight is skipped
	// (consistent hashing with bounded loads, Mirrokni et al. 2018).
	LoadFactor float64 `yaml:"load_factor"`
	// MinInflight: below this an endpoint is never considered overloaded, so
	// a lone busy session at low traffic is not spilled.
	MinInflight int64 `yaml:"min_inflight"`
}

// Validate checks the params.
func (c *SessionHashConfig) Validate() error {
	if c.VNodes < 1 || c.VNodes > 4096 {
		return fmt.Errorf("session-hash vnodes %d out of range [1, 4096]", c.VNodes)
	}
	if c.LoadFactor < 1 {
		return fmt.Errorf("session-hash load_factor %v must be >= 1", c.LoadFactor)
	}
	if c.MinInflight < 0 {
		return fmt.Errorf("session-hash min_inflight must be >= 0")
	}
	return nil
}

type ringPoint struct {
	hash uint64
	ep   int32
}

// SessionHash keeps a session on one replica with a hash ring; requests
// without a session go to least-request. Adding one of N endpoints moves
// about 1/N of sessions, removing one moves only its sessions.
type SessionHash struct {
	cfg      SessionHashConfig
	ring     []ringPoint
	fallback *LeastRequest
}

// NewSessionHashFactory returns the factory for session-hash.
func NewSessionHashFactory() Factory {
	return func(pc *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
		cfg := SessionHashConfig{VNodes: 160, LoadFactor: 1.25, MinInflight: 4}
		if err := pc.DecodeParams(&cfg); err != nil {
			return nil, err
		}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return NewSessionHash(cfg, env.Pool, env.Rand), nil
	}
}

// NewSessionHash builds the ring for pool p.
func NewSessionHash(cfg SessionHashConfig, p *fleet.Pool, rnd *fleet.Rand) *SessionHash {
	s := &SessionHash{cfg: cfg, fallback: NewLeastRequest(rnd)}
	for i, e := range p.Endpoints {
		for v := 0; v < cfg.VNodes; v++ {
			// Ring points depend only on the endpoint name, so membership
			// changes move only the sessions of the changed endpoints.
			h := xxhash.Sum64String(e.Name + "#" + strconv.Itoa(v))
			s.ring = append(s.ring, ringPoint{hash: h, ep: int32(i)})
		}
	}
	slices.SortFunc(s.ring, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.ep - b.ep)
	})
	return s
}

// Pick implements Policy.
func (s *SessionHash) Pick(r *fleet.Request, p *fleet.Pool, c *fleet.Choice) {
	if !r.HasSession || len(s.ring) == 0 {
		s.fallback.Pick(r, p, c)
		return
	}
	var total int64
	avail := 0
	for _, e := range p.Endpoints {
		if e.Available() {
			total += e.Load()
			avail++
		}
	}
	if avail == 0 {
		c.Outcome = fleet.OutcomeNoEndpoint
		return
	}
	// Bound = ceil(c * (total+1) / avail): the +1 counts this request.
	bound := int64(s.cfg.LoadFactor*float64(total+1)/float64(avail) + 0.999999)
	bound = max(bound, s.cfg.MinInflight)
	// Binary search the first ring point >= hash.
	lo, hi := 0, len(s.ring)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.ring[m].hash < r.SessionHash {
			lo = m + 1
		} else {
			hi = m
		}
	}
	first := true
	dst := c.Endpoints
	start := len(dst)
	var skipped *fleet.Endpoint
	for i := 0; i < len(s.ring) && len(dst) < cap(dst); i++ {
		e := p.Endpoints[s.ring[(lo+i)%len(s.ring)].ep]
		if !e.Available() || fleet.Contains(dst, e) || e == skipped {
			continue
		}
		if e.Load()+1 > bound {
			if first {
				skipped = e // the session's own replica is overloaded
			}
			first = false
			continue
		}
		first = false
		dst = append(dst, e)
	}
	switch {
	case len(dst) == start:
		// Every endpoint is over the bound: least loaded still serves.
		c.Outcome = fleet.OutcomeOverflow
		dst = fleet.FillLeastLoaded(dst, p, nil)
	case skipped != nil:
		c.Outcome = fleet.OutcomeOverflow
	default:
		c.Outcome = fleet.OutcomeAffinity
	}
	c.Endpoints = dst
}

var _ fleet.Policy = (*SessionHash)(nil)

// LoadAware implements LoadAware: the bound on loads moves sessions.
func (*SessionHash) LoadAware() bool { return true }

var _ fleet.LoadAware = (*SessionHash)(nil)
