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
//
// Preset: two profiles, chosen per request (llm-d's profile handler): with
// a session, the Ring picker then the LastResort fill; without one,
// least-request.
type SessionHash struct {
	session  Profile
	ring     *Ring
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
	r := NewRing(cfg, p)
	return &SessionHash{
		ring:     r,
		session:  Profile{Name: SessionHashType, Summary: Summary{Load: true, RequireAvailable: true}, Pickers: []Picker{r, LastResort()}},
		fallback: NewLeastRequest(rnd),
	}
}

// Pick implements Policy.
func (s *SessionHash) Pick(r *fleet.Request, p *fleet.Pool, c *fleet.Choice) {
	if !r.HasSession || len(s.ring.points) == 0 {
		s.fallback.Pick(r, p, c)
		return
	}
	s.session.Pick(r, p, c)
}

// Ring is consistent hashing with bounded loads (Mirrokni et al. 2018) on
// the request's session: endpoints in ring order from the session's point,
// skipping any that one more request would put above
// max(ceil(LoadFactor·(total+1)/available), MinInflight).
type Ring struct {
	cfg    SessionHashConfig
	points []ringPoint
}

// NewRing builds the ring for pool p.
func NewRing(cfg SessionHashConfig, p *fleet.Pool) *Ring {
	s := &Ring{cfg: cfg}
	for i, e := range p.Endpoints {
		for v := 0; v < cfg.VNodes; v++ {
			// Ring points depend only on the endpoint name, so membership
			// changes move only the sessions of the changed endpoints.
			h := xxhash.Sum64String(e.Name + "#" + strconv.Itoa(v))
			s.points = append(s.points, ringPoint{hash: h, ep: int32(i)})
		}
	}
	slices.SortFunc(s.points, func(a, b ringPoint) int {
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

// Pick implements Picker: affinity when the session's own replica is
// within the bound, overflow when it was skipped; nothing when every
// replica is over it (the LastResort fill follows).
func (s *Ring) Pick(c *Cycle) {
	r, p := c.Req, c.Pool
	// Bound = ceil(c * (total+1) / avail): the +1 counts this request.
	bound := int64(s.cfg.LoadFactor*float64(c.TotalLoad+1)/float64(c.N) + 0.999999)
	bound = max(bound, s.cfg.MinInflight)
	// Binary search the first ring point >= hash.
	lo, hi := 0, len(s.points)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.points[m].hash < r.SessionHash {
			lo = m + 1
		} else {
			hi = m
		}
	}
	first := true
	dst := c.Choice.Endpoints
	start := len(dst)
	var skipped *fleet.Endpoint
	for i := 0; i < len(s.points) && len(dst) < cap(dst); i++ {
		e := p.Endpoints[s.points[(lo+i)%len(s.points)].ep]
		if !c.Usable(e) || fleet.Contains(dst, e) || e == skipped {
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
	if len(dst) > start {
		c.Choice.Outcome = fleet.OutcomeAffinity
		if skipped != nil {
			c.Choice.Outcome = fleet.OutcomeOverflow
		}
	}
	c.Choice.Endpoints = dst
}

var (
	_ fleet.Policy = (*SessionHash)(nil)
	_ Picker       = (*Ring)(nil)
)

// LoadAware implements LoadAware: the bound on loads moves sessions.
func (*SessionHash) LoadAware() bool { return true }

var _ fleet.LoadAware = (*SessionHash)(nil)
