package policy

import (
	"sync/atomic"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// RoundRobinType is the registry name of RoundRobin.
const RoundRobinType = "round-robin"

// RoundRobin rotates through available endpoints; fallbacks continue the rotation.
type RoundRobin struct {
	next atomic.Uint64
}

// NewRoundRobinFactory returns the factory for round-robin (no params).
func NewRoundRobinFactory() Factory {
	return func(cfg *config.PolicyConfig, _ fleet.PolicyEnv) (fleet.Policy, error) {
		var none struct{}
		if err := cfg.DecodeParams(&none); err != nil {
			return nil, err
		}
		return &RoundRobin{}, nil
	}
}

// Pick implements Policy.
func (rr *RoundRobin) Pick(_ *fleet.Request, p *fleet.Pool, c *fleet.Choice) {
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
	c.Endpoints, c.Outcome = dst, fleet.OutcomeBalanced
}

var _ fleet.Policy = (*RoundRobin)(nil)
