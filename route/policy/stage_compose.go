package policy

import (
	"fmt"
	"maps"
	"slices"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Stage names of the built-in stages.
const (
	LoadGuardStage = "load-guard"
	PrefixStage    = "prefix"
	LoadStage      = "load"
)

// LoadGuardParams are the params of the load-guard filter: prefix-affinity's
// guard, with its defaults.
type LoadGuardParams struct {
	BalanceAbs  int64   `yaml:"balance_abs"`
	BalanceRel  float64 `yaml:"balance_rel"`
	BoundedLoad float64 `yaml:"bounded_load"`
}

// NewLoadGuardFilter builds the load-guard filter.
func NewLoadGuardFilter(cfg *config.StageConfig, _ StageEnv) (Filter, error) {
	d := DefaultPrefixAffinityConfig()
	p := LoadGuardParams{BalanceAbs: d.BalanceAbs, BalanceRel: d.BalanceRel}
	if err := cfg.DecodeParams(&p); err != nil {
		return nil, err
	}
	switch {
	case p.BalanceAbs < 0:
		return nil, fmt.Errorf("load-guard balance_abs must be >= 0")
	case p.BalanceRel < 1:
		return nil, fmt.Errorf("load-guard balance_rel %v must be >= 1", p.BalanceRel)
	case p.BoundedLoad < 0 || p.BoundedLoad > 100:
		return nil, fmt.Errorf("load-guard bounded_load %v out of range [0, 100] (0: off)", p.BoundedLoad)
	}
	return &LoadGuard{Abs: p.BalanceAbs, Rel: p.BalanceRel, Bounded: p.BoundedLoad}, nil
}

// PrefixParams are the params of the prefix scorer (prefix-affinity's index).
type PrefixParams struct {
	BlockBytes     int `yaml:"block_bytes"`
	CapacityBlocks int `yaml:"capacity_blocks"`
}

// NewPrefixScorer builds the prefix scorer: the fraction of the prompt's
// blocks the endpoint was sent before (unit: 0..1), from its own index,
// which records every decision's first choice.
func NewPrefixScorer(cfg *config.StageConfig, env StageEnv) (Scorer, error) {
	d := DefaultPrefixAffinityConfig()
	p := PrefixParams{BlockBytes: d.BlockBytes, CapacityBlocks: d.CapacityBlocks}
	if err := cfg.DecodeParams(&p); err != nil {
		return nil, err
	}
	d.BlockBytes, d.CapacityBlocks = p.BlockBytes, p.CapacityBlocks
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return newPrefixIndex(p.BlockBytes, p.CapacityBlocks, env.Pool), nil
}

// Score implements Scorer.
func (x *PrefixIndex) Score(c *Cycle, e *fleet.Endpoint) float64 {
	if len(c.Req.Blocks) == 0 {
		return 0
	}
	return float64(x.Match(c, e)) / float64(len(c.Req.Blocks))
}

// NewLoadScorer builds the load scorer (-Load, unit: requests).
func NewLoadScorer(cfg *config.StageConfig, _ StageEnv) (Scorer, error) {
	var none struct{}
	return LoadScore{}, cfg.DecodeParams(&none)
}

// Composed is a policy composed in the config: its filters keep the
// candidates, the weighted sum of its scorers ranks them, the best is
// chosen (ties: lower load, the session's replica, a random rotation),
// then the fallbacks are filled (least loaded, or by score); when the
// filters leave nothing, the least loaded still serves (overflow).
type Composed struct {
	Profile
	prefix *PrefixIndex // nil without a prefix scorer
}

// LoadAware implements LoadAware: the last-resort and least-loaded fills
// read in-flight counts.
func (*Composed) LoadAware() bool { return true }

// ComposedPrefix is a Composed policy with a prefix scorer: it wants the
// prompt's block hashes, keeps its index across reloads and learns what
// other instances routed.
type ComposedPrefix struct{ Composed }

// BlockBytes implements PromptUser.
func (c *ComposedPrefix) BlockBytes() int { return c.prefix.blockBytes }

// Carry implements Stater.
func (c *ComposedPrefix) Carry(prev fleet.Policy) {
	if old, ok := prev.(*ComposedPrefix); ok {
		c.prefix.carry(old.prefix)
	}
}

// RecordPrefix implements PrefixRecorder.
func (c *ComposedPrefix) RecordPrefix(i int, blocks []uint64) { c.prefix.recordAt(i, blocks) }

// compose builds a policy from stages.
func (s *Registry) compose(pc *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
	st := pc.Stages
	senv := StageEnv{Pool: env.Pool, Rand: env.Rand}
	if senv.Rand == nil {
		senv.Rand = fleet.NewRand(1)
	}
	main := &MaxScore{Name: "max-score", Ties: []Tie{LowerLoad{}, SessionRank{}}, Rand: senv.Rand, Slots: 1}
	served := false
	for i := range st.Filters {
		f, err := buildStage(&st.Filters[i], "filter", s.filters, senv)
		if err != nil {
			return nil, err
		}
		if g, ok := f.(*LoadGuard); ok && g.Bounded > 0 {
			served = true
		}
		main.Filters = append(main.Filters, f)
	}
	var prefix *PrefixIndex
	var recorders []Recorder
	for i := range st.Scorers {
		sc := &st.Scorers[i]
		x, err := buildStage(sc, "scorer", s.scorers, senv)
		if err != nil {
			return nil, err
		}
		if px, ok := x.(*PrefixIndex); ok {
			if prefix != nil {
				return nil, sc.Error(fmt.Errorf("a policy has at most one prefix scorer"))
			}
			prefix = px
		}
		if r, ok := x.(Recorder); ok {
			recorders = append(recorders, r)
		}
		main.Scorers = append(main.Scorers, Weighted{Scorer: x, Weight: sc.W()})
	}
	pickers := []Picker{&prefixMatched{main, prefix}}
	if st.Fallbacks == config.FallbacksScore {
		main.Slots = 0
		pickers = append(pickers, LastResort())
	} else {
		pickers = append(pickers, LastResort(), NewLeastLoaded(senv.Rand))
	}
	fill := func(c *Composed) {
		c.prefix = prefix
		c.Profile = Profile{Name: pc.Name, Summary: Summary{Load: true, Served: served, RequireAvailable: true},
			Pickers: pickers, Recorders: recorders}
	}
	if prefix != nil {
		cp := &ComposedPrefix{}
		fill(&cp.Composed)
		return cp, nil
	}
	c := &Composed{}
	fill(c)
	return c, nil
}

// buildStage builds stage cfg with its factory among factories (kind:
// filter or scorer, for the error naming the known ones).
func buildStage[T any, F ~func(*config.StageConfig, StageEnv) (T, error)](cfg *config.StageConfig, kind string, factories map[string]F, env StageEnv) (T, error) {
	f, ok := factories[cfg.Name]
	if !ok {
		var none T
		return none, cfg.Unknown(kind, slices.Sorted(maps.Keys(factories)))
	}
	x, err := f(cfg, env)
	if err != nil {
		return x, cfg.Error(err)
	}
	return x, nil
}

// prefixMatched runs a picker and, with a prefix index, makes the first
// choice's matched blocks the choice's Matched (affinity when > 0).
type prefixMatched struct {
	*MaxScore
	prefix *PrefixIndex
}

// Pick implements Picker.
func (p *prefixMatched) Pick(c *Cycle) {
	p.MaxScore.Pick(c)
	if f := c.First(); f != nil && p.prefix != nil {
		if c.Choice.Matched = p.prefix.Match(c, f); c.Choice.Matched > 0 {
			c.Choice.Outcome = fleet.OutcomeAffinity
		}
	}
}

var (
	_ fleet.Policy         = (*Composed)(nil)
	_ fleet.LoadAware      = (*Composed)(nil)
	_ fleet.PromptUser     = (*ComposedPrefix)(nil)
	_ fleet.Stater         = (*ComposedPrefix)(nil)
	_ fleet.PrefixRecorder = (*ComposedPrefix)(nil)
	_ Scorer               = (*PrefixIndex)(nil)
)
