package policy

import (
	"fmt"
	"slices"
	"strconv"

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
	// NewLoadFactor is the bound, as LoadFactor, for a session this
	// instance has not placed yet (its first request: nothing is cached
	// for it anywhere, so placing it by load costs no hit). 1: only on a
	// replica at or below the mean load (MinInflight still applies).
	NewLoadFactor float64 `yaml:"new_load_factor"`
	// Sessions is how many sessions' placements are remembered (rounded
	// up to a power of two, 8 bytes each): a session moved off a loaded
	// replica stays where it moved, and a session not remembered is new.
	// 0: no memory, every request is placed by the ring and LoadFactor
	// alone.
	Sessions int `yaml:"sessions"`
}

// DefaultSessionHashConfig are session-hash's defaults.
func DefaultSessionHashConfig() SessionHashConfig {
	return SessionHashConfig{VNodes: 160, LoadFactor: 2, MinInflight: 4, NewLoadFactor: 1, Sessions: 1 << 16}
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
	if c.NewLoadFactor < 1 {
		return fmt.Errorf("session-hash new_load_factor %v must be >= 1", c.NewLoadFactor)
	}
	if c.Sessions < 0 || c.Sessions > 1<<24 {
		return fmt.Errorf("session-hash sessions %d out of range [0, %d]", c.Sessions, 1<<24)
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
// Preset: a profile handler (Pick) that runs one of two profiles per
// request: with a session, the Ring picker then the LastResort fill;
// without one, least-request's.
type SessionHash struct {
	session  Profile
	ring     *Ring
	fallback *LeastRequest
}

// NewSessionHashFactory returns the factory for session-hash.
func NewSessionHashFactory() Factory {
	return configured(DefaultSessionHashConfig, func(cfg SessionHashConfig, env fleet.PolicyEnv) fleet.Policy {
		return NewSessionHash(cfg, env.Pool, env.Rand)
	})
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
// max(ceil(f·(total+1)/available), MinInflight), load being
// Endpoint.Load (the engine's running + waiting at the last scrape moved
// by the decisions since; in-flight decisions when nothing scrapes).
//
// With a session memory (Sessions > 0, the default) two things change,
// both found on the Mooncake replay with caches that bind (BENCHMARKS.md):
// over half its requests open a session, and the ring placed
// them on a replica already above the mean, where the bound later pushed
// sessions with a warm cache off again; round robin was better at p50.
//   - A session this instance has not placed yet is bounded by
//     NewLoadFactor (1: at or below the mean load): its first request has
//     nothing cached anywhere, so the ring home is kept only while it is
//     not the busier side.
//   - A session placed before goes first to where it was last placed,
//     within LoadFactor (a moved session stays on the replica that now
//     holds its cache instead of bouncing home); past it, the ring walk.
type Ring struct {
	cfg    SessionHashConfig
	points []ringPoint
	names  []string // endpoint names by pool index (carrying the memory)
	mem    sessionMemory
}

// NewRing builds the ring for pool p.
func NewRing(cfg SessionHashConfig, p *fleet.Pool) *Ring {
	s := &Ring{cfg: cfg, mem: newSessionMemory(cfg.Sessions)}
	for i, e := range p.Endpoints {
		s.names = append(s.names, e.Name)
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

// bound is max(ceil(f·(total+1)/available), MinInflight): the +1 counts
// this request.
func (s *Ring) bound(f float64, c *Cycle) int64 {
	return max(int64(f*float64(c.TotalLoad+1)/float64(c.N)+0.999999), s.cfg.MinInflight)
}

// Pick implements Picker: affinity when the session's own replica (or the
// one it was last moved to) is within the bound, overflow when the ring
// walk skipped its own; nothing when every replica is over it (the
// LastResort fill follows).
func (s *Ring) Pick(c *Cycle) {
	r, p := c.Req, c.Pool
	dst := c.Choice.Endpoints
	start := len(dst)
	// bound applies to the fallbacks, first to the first choice.
	bound := s.bound(s.cfg.LoadFactor, c)
	first := bound
	var kept *fleet.Endpoint
	if s.mem.on() {
		i, known := s.mem.lookup(r.SessionHash)
		switch {
		case !known:
			first = s.bound(s.cfg.NewLoadFactor, c)
		case i >= 0 && i < len(p.Endpoints) && len(dst) < cap(dst):
			if e := p.Endpoints[i]; c.Usable(e) && e.Load()+1 <= bound {
				kept = e
				dst = append(dst, e)
			}
		}
	}
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
	home := true
	var skipped *fleet.Endpoint
	for i := 0; i < len(s.points) && len(dst) < cap(dst); i++ {
		e := p.Endpoints[s.points[(lo+i)%len(s.points)].ep]
		if !c.Usable(e) || fleet.Contains(dst, e) || e == skipped {
			continue
		}
		b := bound
		if len(dst) == start {
			b = first
		}
		if e.Load()+1 > b {
			if home {
				skipped = e // the session's own replica is overloaded
			}
			home = false
			continue
		}
		home = false
		dst = append(dst, e)
	}
	if len(dst) > start {
		c.Choice.Outcome = fleet.OutcomeAffinity
		if skipped != nil && dst[start] != kept {
			c.Choice.Outcome = fleet.OutcomeOverflow
		}
		if s.mem.on() {
			s.mem.store(r.SessionHash, dst[start].Index)
		}
	}
	c.Choice.Endpoints = dst
}

// carry moves prev's session memory onto this ring's endpoints by name.
func (s *Ring) carry(prev *Ring) {
	remap := make([]int, len(prev.names))
	for i, n := range prev.names {
		remap[i] = slices.Index(s.names, n)
	}
	s.mem.carry(&prev.mem, remap)
}

// Carry implements fleet.Stater: sessions moved off their ring home stay
// where they went across reloads and discovery changes.
func (s *SessionHash) Carry(prev fleet.Policy) {
	if old, ok := prev.(*SessionHash); ok {
		s.ring.carry(old.ring)
	}
}

var (
	_ fleet.Policy = (*SessionHash)(nil)
	_ fleet.Stater = (*SessionHash)(nil)
	_ Picker       = (*Ring)(nil)
)

// LoadAware implements LoadAware: the bound on loads moves sessions.
func (*SessionHash) LoadAware() bool { return true }

var _ fleet.LoadAware = (*SessionHash)(nil)
