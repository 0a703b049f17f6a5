package models

import (
	"sort"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Dep is one deployment as the table sees it: its config and the pools its
// decision profiles pick from, in profile order (serve, then prefill).
type Dep struct {
	Config *config.DeploymentConfig
	Pools  []*fleet.Pool
}

// MaxProfiles is how many pools a deployment's decision picks from.
const MaxProfiles = 2

// Refusal is what a decision answers for a model without endpoints.
type Refusal uint8

// Refusals.
const (
	RefuseNone    Refusal = iota
	RefuseUnknown         // 404: no endpoint has ever served it
	RefuseGone            // 503 + Retry-After: endpoints served it, none does now
)

// Entry is one model name's routing.
type Entry struct {
	Dep int32 // index into the Deps given to Build
	Idx int32 // index into Table.Names
	// Only are, per profile pool, the endpoints that serve the name (nil:
	// every endpoint, the usual case for a deployment's base model).
	Only    [MaxProfiles]fleet.Mask
	Adapter bool
	Refuse  Refusal
	// Stats are the name's counters (never nil from Build).
	Stats *ModelStats
}

// Table is the model routing of one snapshot.
type Table struct {
	byName map[string]*Entry
	// Names are every name, the deployments' models first in config order
	// (the snapshot's model indices), then adapters sorted (from nBase).
	Names []string
	nBase int
}

// IsAdapter reports whether Names[idx] is a LoRA adapter.
func (t *Table) IsAdapter(idx int32) bool { return int(idx) >= t.nBase && int(idx) < len(t.Names) }

// HasAdapters reports whether the table routes any LoRA adapter.
func (t *Table) HasAdapters() bool { return len(t.Names) > t.nBase }

// Lookup returns the name's entry, nil when no deployment routes it. It
// does not allocate.
func (t *Table) Lookup(model []byte) *Entry { return t.byName[string(model)] }

// Len is how many names the table routes.
func (t *Table) Len() int { return len(t.Names) }

// Seen remembers which deployment routed a name that endpoints served,
// so a name none serves any more is told apart from one never served
// (503 instead of 404). Bounded: past MaxSeen names nothing new is kept.
// Not safe for concurrent use: the Decider builds tables under its lock.
type Seen struct{ m map[string]string }

// MaxSeen bounds Seen.
const MaxSeen = 10000

// NewSeen returns an empty memory.
func NewSeen() *Seen { return &Seen{m: map[string]string{}} }

func (s *Seen) note(name, dep string) {
	if _, ok := s.m[name]; ok || len(s.m) < MaxSeen {
		s.m[name] = dep
	}
}

// related reports whether an endpoint's list speaks for deployment dc: it
// names one of its models or adapters. An endpoint whose list names none
// of them is either misplaced or permissive (a mock without
// --strict-models answers every name): it keeps the deployment's base
// models, as before turnout learned lists, and the background check warns.
func related(sm *fleet.ServedModels, dc *config.DeploymentConfig) bool {
	if sm.Source != fleet.ModelsListed {
		return true
	}
	for _, m := range sm.Models {
		for _, n := range dc.Models {
			if m.ID == n {
				return true
			}
		}
		if m.Parent != "" && dc.ClaimsAdapter(m.ID, m.Parent) {
			return true
		}
	}
	return false
}

// Build makes the table of deps from their endpoints' current knowledge,
// noting in seen what is served now (seen may be nil) and taking each
// name's counters from stats (nil: counters of their own).
func Build(deps []Dep, seen *Seen, stats *Stats) *Table {
	if stats == nil {
		stats = NewStats()
	}
	t := &Table{byName: map[string]*Entry{}}
	add := func(name string, di int, adapter bool) *Entry {
		e := &Entry{Dep: int32(di), Idx: -1, Adapter: adapter}
		t.byName[name] = e
		return e
	}
	for di := range deps {
		for _, m := range deps[di].Config.Models {
			if t.byName[m] == nil {
				add(m, di, false).Idx = int32(len(t.Names))
				t.Names = append(t.Names, m)
			}
		}
	}
	nBase := len(t.Names)
	t.nBase = nBase
	var adapters []string
	// set marks endpoint i of profile pi as serving name, for deployment di.
	set := func(name string, di, pi, i, n int, adapter bool) {
		e := t.byName[name]
		if e == nil {
			if !adapter {
				return
			}
			e = add(name, di, true)
			adapters = append(adapters, name)
		}
		if int(e.Dep) != di {
			return // another deployment routes the name (config order wins)
		}
		if e.Only[pi] == nil {
			e.Only[pi] = fleet.NewMask(n)
		}
		e.Only[pi].Set(i)
	}
	for di := range deps {
		dc := deps[di].Config
		for pi, p := range deps[di].Pools {
			if pi >= MaxProfiles {
				break
			}
			n := len(p.Endpoints)
			for i, ep := range p.Endpoints {
				sm := ep.ServedModels()
				if sm == nil || !related(sm, dc) {
					for _, m := range dc.Models {
						set(m, di, pi, i, n, false)
					}
				} else {
					for _, m := range sm.Models {
						switch {
						case isBase(dc, m.ID):
							set(m.ID, di, pi, i, n, false)
						case sm.Source != fleet.ModelsListed || dc.ClaimsAdapter(m.ID, m.Parent):
							set(m.ID, di, pi, i, n, true)
						}
					}
				}
				if l := ep.LoRA(); l != nil {
					for _, a := range l.Running {
						set(a, di, pi, i, n, true)
					}
					for _, a := range l.Waiting {
						set(a, di, pi, i, n, true)
					}
				}
			}
		}
	}
	// Names served before and by no endpoint now.
	byDep := map[string]int{}
	for di := range deps {
		byDep[deps[di].Config.Name] = di
	}
	if seen != nil {
		for name, dn := range seen.m {
			di, ok := byDep[dn]
			if !ok || t.byName[name] != nil {
				continue
			}
			add(name, di, true)
			adapters = append(adapters, name)
		}
	}
	sort.Strings(adapters)
	for _, a := range adapters {
		t.byName[a].Idx = int32(len(t.Names))
		t.Names = append(t.Names, a)
	}
	// A mask that holds every endpoint is nil (no test per candidate); one
	// that holds none refuses before any pick.
	for i, name := range t.Names {
		e := t.byName[name]
		e.Stats = stats.For(name, deps[e.Dep].Config.Name, e.Adapter)
		pools := deps[e.Dep].Pools
		served := false
		for pi := range e.Only {
			if pi >= len(pools) {
				e.Only[pi] = nil
				continue
			}
			n := len(pools[pi].Endpoints)
			if e.Only[pi] == nil {
				if e.Adapter || i < nBase && n > 0 {
					e.Only[pi] = fleet.NewMask(n) // nobody marked it
				}
			}
			switch c := e.Only[pi].Count(); {
			case c == n && n > 0:
				e.Only[pi] = nil
				served = served || pi == 0
			case c > 0 && pi == 0:
				served = true
			}
		}
		if n := len(pools[0].Endpoints); n == 0 && !e.Adapter {
			served = true // nothing to judge by: discovery has not found any yet
		}
		switch {
		case served:
			if seen != nil {
				seen.note(name, deps[e.Dep].Config.Name)
			}
		case seen != nil && seen.m[name] != "":
			e.Refuse = RefuseGone
		default:
			e.Refuse = RefuseUnknown
		}
	}
	return t
}

func isBase(dc *config.DeploymentConfig, id string) bool {
	for _, n := range dc.Models {
		if n == id {
			return true
		}
	}
	return false
}

// Servers lists, for name, the endpoint names of profile pool pi that serve
// it (nil when the table does not route the name): /readyz?verbose.
func (t *Table) Servers(deps []Dep, name string, pi int) []string {
	e := t.byName[name]
	if e == nil || int(e.Dep) >= len(deps) || pi >= len(deps[e.Dep].Pools) {
		return nil
	}
	var out []string
	for i, ep := range deps[e.Dep].Pools[pi].Endpoints {
		if e.Only[pi].Has(i) {
			out = append(out, ep.Name)
		}
	}
	return out
}
