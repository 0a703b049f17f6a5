// Package toy is the worked example of docs/policies.md: a policy added as
// this one folder plus one registration line (Registry.Policy), with no
// change to the decision pipeline (route). It sends a request to the
// replica whose engine reported the fewest waiting requests, and logs that
// count with the decision (fleet.Notes). Tests only: not registered in
// the service.
package toy

import (
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/policy"
)

// Type is the toy policy's registry name.
const Type = "toy-fewest-waiting"

// noteWaiting is the index of the first choice's waiting count among the
// figures the policy logs (NoteKeys).
const noteWaiting = 0

// Policy is one profile of stages from route/policy: the fewest waiting
// (ties: lower load, fewer recent decisions), then the least loaded as
// fallbacks.
type Policy struct {
	policy.Profile
	keys [1]string
}

// NewFactory returns the toy's factory (no params).
func NewFactory() policy.Factory {
	return func(pc *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
		var none struct{}
		if err := pc.DecodeParams(&none); err != nil {
			return nil, err
		}
		rnd := env.Rand
		if rnd == nil {
			rnd = fleet.NewRand(1)
		}
		p := &Policy{keys: [...]string{noteWaiting: "toy_waiting"}}
		best := &policy.MaxScore{Name: Type, Rand: rnd, Slots: 1,
			Scorers: []policy.Weighted{{Scorer: fewerWaiting{}, Weight: 1}},
			Ties:    []policy.Tie{policy.LowerLoad{}, policy.FewerRecent{}}}
		p.Profile = policy.Profile{Name: Type, Summary: policy.Summary{RequireAvailable: true},
			Pickers: []policy.Picker{best, noteFirst{}, policy.NewLeastLoaded(rnd)}}
		return p, nil
	}
}

// NoteKeys implements fleet.Annotator.
func (p *Policy) NoteKeys() []string { return p.keys[:] }

// fewerWaiting scores minus the engine's waiting requests (unit:
// requests); without a scrape, minus the in-flight decisions.
type fewerWaiting struct{}

// Score implements policy.Scorer.
func (fewerWaiting) Score(_ *policy.Cycle, e *fleet.Endpoint) float64 {
	if w, ok := e.Waiting(); ok {
		return -float64(w)
	}
	return -float64(e.Inflight())
}

// Signals implements fleet.Consumer.
func (fewerWaiting) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalWaiting, fleet.SignalInflight)
}

// noteFirst writes the first choice's waiting count into the decision's
// Notes (when a scrape gave one).
type noteFirst struct{}

// Pick implements policy.Picker.
func (noteFirst) Pick(c *policy.Cycle) {
	if f := c.First(); f != nil {
		if w, ok := f.Waiting(); ok {
			c.Choice.Notes.Set(noteWaiting, float32(w))
		}
	}
}

// Signals implements fleet.Consumer.
func (noteFirst) Signals() fleet.Signals { return fleet.SignalSet(fleet.SignalWaiting) }

var (
	_ fleet.Policy    = (*Policy)(nil)
	_ fleet.Annotator = (*Policy)(nil)
	_ policy.Scorer   = fewerWaiting{}
	_ policy.Picker   = noteFirst{}
)
