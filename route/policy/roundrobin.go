package policy

import (
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// RoundRobinType is the registry name of RoundRobin.
const RoundRobinType = "round-robin"

// RoundRobin rotates through available endpoints; fallbacks continue the
// rotation. Preset: the Rotation picker alone, which needs no cycle, so it
// runs without one (and the zero value works).
type RoundRobin struct {
	rot Rotation
}

// NewRoundRobin returns the preset.
func NewRoundRobin() *RoundRobin { return &RoundRobin{} }

// Pick implements Policy.
func (rr *RoundRobin) Pick(r *fleet.Request, p *fleet.Pool, c *fleet.Choice) {
	c.Endpoints, c.Outcome = rr.rot.pick(p, r.Only, c.Endpoints), fleet.OutcomeBalanced
}

// NewRoundRobinFactory returns the factory for round-robin (no params).
func NewRoundRobinFactory() Factory {
	return func(cfg *config.PolicyConfig, _ fleet.PolicyEnv) (fleet.Policy, error) {
		var none struct{}
		if err := cfg.DecodeParams(&none); err != nil {
			return nil, err
		}
		return NewRoundRobin(), nil
	}
}

var _ fleet.Policy = (*RoundRobin)(nil)
