package policy

import (
	"fmt"
	"sort"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Factory builds a policy for one pool from its config; params are validated here.
type Factory func(cfg *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error)

// Registry maps policy names to factories. Registration is explicit (no init()).
type Registry struct {
	m map[string]Factory
	// stages build the policies a config composes (presets, inline stages).
	stages *Stages
}

// NewRegistry returns an empty registry composing from stages.
func NewRegistry(stages *Stages) *Registry { return &Registry{m: map[string]Factory{}, stages: stages} }

// Register adds a factory; a duplicate name is a programming error.
func (r *Registry) Register(name string, f Factory) {
	if _, dup := r.m[name]; dup {
		panic("route: policy registered twice: " + name)
	}
	r.m[name] = f
}

// Names lists registered policies, sorted.
func (r *Registry) Names() []string {
	out := make([]string, 0, len(r.m))
	for n := range r.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Build builds the named policy.
func (r *Registry) Build(cfg *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
	f, ok := r.m[cfg.Name]
	if cfg.Stages != nil {
		if ok {
			return nil, cfg.NameError(fmt.Errorf("preset %q has the name of a built-in policy", cfg.Name))
		}
		return r.stages.compose(cfg, env)
	}
	if !ok {
		return nil, cfg.UnknownPolicy(r.Names())
	}
	p, err := f(cfg, env)
	if err != nil {
		return nil, cfg.ParamsError(err)
	}
	return p, nil
}

// DefaultRegistry registers the built-in policies.
func DefaultRegistry() *Registry {
	r := NewRegistry(DefaultStages())
	r.Register(RoundRobinType, NewRoundRobinFactory())
	r.Register(LeastRequestType, NewLeastRequestFactory())
	r.Register(SessionHashType, NewSessionHashFactory())
	r.Register(PrefixAffinityType, NewPrefixAffinityFactory())
	r.Register(KVAwareType, NewKVAwareFactory())
	r.Register(LoRAAffinityType, NewLoRAAffinityFactory())
	r.Register(PredictedTTFTType, NewPredictedTTFTFactory())
	return r
}
