package route

import (
	"sync/atomic"

	"github.com/turnout/turnout/internal/config"
)

// RoundRobinType is the registry name of RoundRobin.
const RoundRobinType = "round-robin"

// RoundRobin rotates through available endpoints; fallbacks continue the rotation.
type RoundRobin struct {
	next atomic.Uint64
}

// NewRoundRobinFactory returns the factory for round-robin (no params).
func NewRoundRobinFactory() Factory {
	return func(cfg *config.PolicyConfig, _ PolicyEnv) (Policy, error) {
		var none struct{}
		if err := cfg.DecodeParams(&none); err != nil {
			return nil, err
		}
		return &RoundRobin{}, nil
	}
}

// Pick implements Policy.
func (rr *RoundRobin) Pick(_ *Request, p *Pool, c *Choice) {
	n := len(p.Endpoints)
	if n == 0 {
		return
	}
	start := int((rr.next.Add(1) - 1) % uint64(n))
	dst := c.Endpoints
	for i := 0; i < n && len(dst) < cap(dst); i++ {
		if e := p.Endpoints[(start+i)%n]; e.Available() {
			dst = append(dst, e)
		}
	}
	c.Endpoints, c.Outcome = dst, OutcomeBalanced
}

var _ Policy = (*RoundRobin)(nil)
