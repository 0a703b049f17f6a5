package policy

import (
	"fmt"
	"maps"
	"slices"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Factory builds a policy for one pool from its config; params are validated here.
type Factory func(cfg *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error)

// StageEnv is what a stage factory gets besides its config.
type StageEnv struct {
	Pool *fleet.Pool
	Rand *fleet.Rand
}

// FilterFactory builds a filter from its config; params are validated here.
type FilterFactory func(cfg *config.StageConfig, env StageEnv) (Filter, error)

// ScorerFactory builds a scorer from its config; params are validated here.
type ScorerFactory func(cfg *config.StageConfig, env StageEnv) (Scorer, error)

// Registry is every name a config may give a policy: the policies by name
// (built-ins) and the stages a config composes a policy of (presets,
// inline stages: filters and scorers; compose fixes the rest). One
// registry, explicit registration (no init()); a duplicate name is a
// programming error.
type Registry struct {
	policies map[string]Factory
	filters  map[string]FilterFactory
	scorers  map[string]ScorerFactory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{policies: map[string]Factory{}, filters: map[string]FilterFactory{}, scorers: map[string]ScorerFactory{}}
}

// Policy registers a policy by name.
func (r *Registry) Policy(name string, f Factory) { add(r.policies, "policy", name, f) }

// Filter registers a filter stage.
func (r *Registry) Filter(name string, f FilterFactory) { add(r.filters, "filter", name, f) }

// Scorer registers a scorer stage.
func (r *Registry) Scorer(name string, f ScorerFactory) { add(r.scorers, "scorer", name, f) }

func add[F any](m map[string]F, kind, name string, f F) {
	if _, dup := m[name]; dup {
		panic("route/policy: " + kind + " registered twice: " + name)
	}
	m[name] = f
}

// Names lists the registered policies, sorted.
func (r *Registry) Names() []string { return slices.Sorted(maps.Keys(r.policies)) }

// FilterNames lists the registered filters, sorted.
func (r *Registry) FilterNames() []string { return slices.Sorted(maps.Keys(r.filters)) }

// ScorerNames lists the registered scorers, sorted.
func (r *Registry) ScorerNames() []string { return slices.Sorted(maps.Keys(r.scorers)) }

// Build builds the policy cfg names, or composes the one it gives as stages.
func (r *Registry) Build(cfg *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
	f, ok := r.policies[cfg.Name]
	if cfg.Stages != nil {
		if ok {
			return nil, cfg.NameError(fmt.Errorf("preset %q has the name of a built-in policy", cfg.Name))
		}
		p, err := r.compose(cfg, env)
		if err == nil {
			applyPruning(p, &env, cfg.Candidates())
		}
		return p, err
	}
	if !ok {
		return nil, cfg.UnknownPolicy(r.Names())
	}
	p, err := f(cfg, env)
	if err != nil {
		return nil, cfg.ParamsError(err)
	}
	applyPruning(p, &env, cfg.Candidates())
	return p, nil
}

// DefaultRegistry registers the built-in policies and stages.
func DefaultRegistry() *Registry {
	r := NewRegistry()
	r.Policy(RoundRobinType, NewRoundRobinFactory())
	r.Policy(LeastRequestType, NewLeastRequestFactory())
	r.Policy(SessionHashType, NewSessionHashFactory())
	r.Policy(PrefixAffinityType, NewPrefixAffinityFactory())
	r.Policy(KVAwareType, NewKVAwareFactory())
	r.Policy(LoRAAffinityType, NewLoRAAffinityFactory())
	r.Policy(PredictedTTFTType, NewPredictedTTFTFactory())

	r.Filter(LoadGuardStage, NewLoadGuardFilter)
	r.Scorer(PrefixStage, NewPrefixScorer)
	r.Scorer(LoadStage, NewLoadScorer)
	r.Scorer(EngineQueueStage, NewEngineQueueScorer)
	r.Scorer(LoRAStage, NewLoRAScorer)
	return r
}

// configured is the factory of a policy with a config type C: params
// decoded over def's defaults, validated, then built.
func configured[C any, P interface {
	*C
	Validate() error
}](def func() C, build func(C, fleet.PolicyEnv) fleet.Policy) Factory {
	return func(pc *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
		cfg := def()
		if err := pc.DecodeParams(&cfg); err != nil {
			return nil, err
		}
		if err := P(&cfg).Validate(); err != nil {
			return nil, err
		}
		return build(cfg, env), nil
	}
}
