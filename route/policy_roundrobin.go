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
func (rr *RoundRobin) Pick(r *Request, p *Pool, dst []*Endpoint) []*Endpoint {
	n := len(p.Endpoints)
	if n == 0 {
		return dst
	}
	start := int((rr.next.Add(1) - 1) % uint64(n))
	for i := 0; i < n && len(dst) < cap(dst); i++ {
		if e := p.Endpoints[(start+i)%n]; e.Available() {
			dst = append(dst, e)
		}
	}
	r.Outcome = OutcomeBalanced
	return dst
}

var _ Policy = (*RoundRobin)(nil)
