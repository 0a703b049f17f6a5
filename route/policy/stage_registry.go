package policy

import (
	"github.com/turnout/turnout/route/fleet"
	"sort"

	"github.com/turnout/turnout/internal/config"
)

// StageEnv is what a stage factory gets besides its config.
type StageEnv struct {
	Pool *fleet.Pool
	Rand *fleet.Rand
}

// FilterFactory builds a filter from its config; params are validated here.
type FilterFactory func(cfg *config.StageConfig, env StageEnv) (Filter, error)

// ScorerFactory builds a scorer from its config; params are validated here.
type ScorerFactory func(cfg *config.StageConfig, env StageEnv) (Scorer, error)

// Stages maps stage names to factories, for policies composed in the
// config (presets, inline stages). Registration is explicit (no init()).
type Stages struct {
	filters map[string]FilterFactory
	scorers map[string]ScorerFactory
}

// NewStages returns an empty stage registry.
func NewStages() *Stages {
	return &Stages{filters: map[string]FilterFactory{}, scorers: map[string]ScorerFactory{}}
}

// Filter registers a filter; a duplicate name is a programming error.
func (s *Stages) Filter(name string, f FilterFactory) {
	if _, dup := s.filters[name]; dup {
		panic("route: filter registered twice: " + name)
	}
	s.filters[name] = f
}

// Scorer registers a scorer; a duplicate name is a programming error.
func (s *Stages) Scorer(name string, f ScorerFactory) {
	if _, dup := s.scorers[name]; dup {
		panic("route: scorer registered twice: " + name)
	}
	s.scorers[name] = f
}

// FilterNames and ScorerNames list the registered stages, sorted.
func (s *Stages) FilterNames() []string { return sortedKeys(s.filters) }

// ScorerNames lists the registered scorers, sorted.
func (s *Stages) ScorerNames() []string { return sortedKeys(s.scorers) }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// DefaultStages registers the built-in stages a config may compose.
func DefaultStages() *Stages {
	s := NewStages()
	s.Filter(LoadGuardStage, NewLoadGuardFilter)
	s.Scorer(PrefixStage, NewPrefixScorer)
	s.Scorer(LoadStage, NewLoadScorer)
	s.Scorer(EngineQueueStage, NewEngineQueueScorer)
	s.Scorer(LoRAStage, NewLoRAScorer)
	return s
}
