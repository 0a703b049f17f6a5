package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// Policies composed from stages (docs/policies.md). A policy is either a
// built-in preset named with its params (policy: {name: prefix-affinity,
// params: {...}}), or stages: inline (policy: {stages: {...}}) or from a
// named preset of the config's presets list (policy: {name: my-preset}).

// CustomPolicy is the name of a policy given by inline stages alone.
const CustomPolicy = "custom"

// PresetConfig is a named policy composed from stages, which deployments
// and pools select by name as they do a built-in policy.
type PresetConfig struct {
	Name   string       `yaml:"name"`
	Stages StagesConfig `yaml:"stages"`
}

// StagesConfig composes a policy: the filters keep the candidates, the
// scorers' weighted sum ranks them, the best one is chosen (ties: lower
// load, the session's replica, then a random rotation) and the fallbacks
// are filled.
type StagesConfig struct {
	Filters []StageConfig `yaml:"filters"`
	Scorers []StageConfig `yaml:"scorers"`
	// Fallbacks fills the fallback slots: least-loaded (default: where a
	// retry waits least) or score (the next best scores).
	Fallbacks string `yaml:"fallbacks"`
}

// Fallback orders.
const (
	FallbacksLeastLoaded = "least-loaded"
	FallbacksScore       = "score"
)

// StageConfig names one stage, with its weight (scorers) and params.
type StageConfig struct {
	Name string `yaml:"name"`
	// Weight multiplies a scorer's score (default 1).
	Weight *float64  `yaml:"weight"`
	Params yaml.Node `yaml:"params"`
	// Where it sits in the file, for the stage factory's errors.
	path string
	line int
}

func (s *StageConfig) setPosition(path string, line int) { s.path, s.line = path, line }

// W is the scorer's weight (1 when unset).
func (s *StageConfig) W() float64 {
	if s.Weight == nil {
		return 1
	}
	return *s.Weight
}

// DecodeParams decodes the stage's params strictly into dst, reporting
// unknown parameters and bad values with their path and file line.
func (s *StageConfig) DecodeParams(dst any) error {
	if s.Params.Kind == 0 {
		return nil
	}
	d := nodeDecoder{pos: positions{}}
	d.decode(&s.Params, reflect.ValueOf(dst).Elem(), s.where()+".params")
	if len(d.errs) > 0 {
		return &ConfigError{Problems: d.errs}
	}
	return nil
}

func (s *StageConfig) where() string {
	if s.path == "" {
		return "stage " + s.Name
	}
	return s.path
}

// Error places a stage factory's error at the stage in the file (a
// *ConfigError from DecodeParams is already placed).
func (s *StageConfig) Error(err error) error {
	var ce *ConfigError
	if errors.As(err, &ce) {
		return ce
	}
	line := s.Params.Line
	if line == 0 {
		line = s.line
	}
	return &ConfigError{Problems: []*FieldError{{Path: s.where(), Line: line, Msg: err.Error()}}}
}

// Unknown is the error for a stage name no factory is registered under,
// suggesting the closest of known.
func (s *StageConfig) Unknown(kind string, known []string) error {
	return &ConfigError{Problems: []*FieldError{{Path: s.where() + ".name", Line: s.line,
		Msg: fmt.Sprintf("unknown %s %q%s (known: %s)", kind, s.Name, suggest(s.Name, known), strings.Join(known, ", "))}}}
}

// NameError places an error about the policy's name at its line.
func (p *PolicyConfig) NameError(err error) error {
	path := "policy.name"
	if p.path != "" {
		path = p.path + ".name"
	}
	return &ConfigError{Problems: []*FieldError{{Path: path, Line: p.line, Msg: err.Error()}}}
}

// validatePresets checks the presets and the stages of every policy, and
// resolves policies naming a preset to its stages.
func (c *Config) validatePresets(bad func(field, format string, a ...any)) {
	presets := map[string]*PresetConfig{}
	for i := range c.Presets {
		pr := &c.Presets[i]
		f := fmt.Sprintf("presets[%d]", i)
		switch {
		case !NameRe.MatchString(pr.Name):
			bad(f+".name", "%s", nameProblem(pr.Name))
		case presets[pr.Name] != nil:
			bad(f+".name", "%q is used twice", pr.Name)
		case pr.Name == CustomPolicy:
			bad(f+".name", "%q is the name of inline stages", pr.Name)
		}
		presets[pr.Name] = pr
		validateStages(f+".stages", &pr.Stages, bad)
	}
	policy := func(f string, p *PolicyConfig) {
		if m := p.MaxCandidates; m != 0 && (m < 16 || m > 1<<16) {
			bad(f+".max_candidates", "%d out of range [16, 65536] (0: the default, %d)", m, DefaultMaxCandidates)
		}
		if p.Stages != nil && !p.preset {
			if p.Params.Kind != 0 {
				bad(f+".params", "a policy composed from stages takes its params per stage")
			}
			validateStages(f+".stages", p.Stages, bad)
		}
		pr := presets[p.Name]
		switch {
		case p.preset && pr != nil:
			p.Stages = &pr.Stages // validated again: resolve again
		case pr != nil && p.Stages != nil:
			bad(f+".stages", "policy %q is a preset: its stages are in presets", p.Name)
		case pr != nil && p.Params.Kind != 0:
			bad(f+".params", "policy %q is a preset: its params are in its stages", p.Name)
		case pr != nil:
			p.Stages, p.preset = &pr.Stages, true
		}
	}
	for i := range c.Deployments {
		d := &c.Deployments[i]
		f := fmt.Sprintf("deployments[%d]", i)
		policy(f+".policy", &d.Policy)
		for j := range d.Pools {
			if p := d.Pools[j].Policy; p != nil {
				policy(fmt.Sprintf("%s.pools[%d].policy", f, j), p)
			}
		}
	}
}

func validateStages(f string, s *StagesConfig, bad func(field, format string, a ...any)) {
	if len(s.Scorers) == 0 {
		bad(f+".scorers", "at least one scorer is required")
	}
	for i := range s.Filters {
		ff := stageField(f, "filters", i, &s.Filters[i], bad)
		if s.Filters[i].Weight != nil {
			bad(ff+".weight", "filters have no weight (scorers do)")
		}
	}
	for i := range s.Scorers {
		ff := stageField(f, "scorers", i, &s.Scorers[i], bad)
		if w := s.Scorers[i].W(); math.IsNaN(w) || math.IsInf(w, 0) || w < 0 || w > 1e6 {
			bad(ff+".weight", "%v out of range [0, 1e6]", w)
		}
	}
	switch s.Fallbacks {
	case "", FallbacksLeastLoaded, FallbacksScore:
	default:
		bad(f+".fallbacks", "%q must be %s or %s", s.Fallbacks, FallbacksLeastLoaded, FallbacksScore)
	}
}

// stageField is the path of stage i of a list, after checking what every
// stage needs: a name.
func stageField(f, list string, i int, st *StageConfig, bad func(field, format string, a ...any)) string {
	ff := fmt.Sprintf("%s.%s[%d]", f, list, i)
	if st.Name == "" {
		bad(ff+".name", "required")
	}
	return ff
}
