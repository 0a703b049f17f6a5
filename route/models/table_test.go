package models

import (
	"slices"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

func pool(n int) *fleet.Pool {
	p := &fleet.Pool{Name: "llama_mixed"}
	for i := range n {
		p.Endpoints = append(p.Endpoints, &fleet.Endpoint{Name: string(rune('a' + i)), Index: i, State: &fleet.State{}})
	}
	return p
}

func listed(e *fleet.Endpoint, ms ...fleet.ServedModel) {
	e.SetServed(&fleet.ServedModels{Source: fleet.ModelsListed, Models: ms})
}

// What Build makes of endpoints' lists: which names route where, and the
// refusal of a name without endpoints.
func TestBuild(t *testing.T) {
	llama := fleet.ServedModel{ID: "llama"}
	ad := func(id, parent string) fleet.ServedModel { return fleet.ServedModel{ID: id, Parent: parent} }
	for _, tc := range []struct {
		name    string
		lists   [][]fleet.ServedModel // nil: not heard from
		lora    []*fleet.LoRAState
		cfg     config.LoRAConfig
		model   string
		servers []string // nil with refuse set; "all" = nil mask
		refuse  Refusal
		absent  bool
	}{
		{name: "nothing known: every endpoint", lists: [][]fleet.ServedModel{nil, nil}, model: "llama", servers: []string{"all"}},
		{name: "base everywhere: nil mask", lists: [][]fleet.ServedModel{{llama}, {llama}}, model: "llama", servers: []string{"all"}},
		{name: "adapter on one", lists: [][]fleet.ServedModel{{llama, ad("sql", "llama")}, {llama}}, model: "sql", servers: []string{"a"}},
		{name: "adapter of another parent", lists: [][]fleet.ServedModel{{llama, ad("m", "mistral")}, {llama}}, model: "m", absent: true},
		{name: "adapter by pattern", lists: [][]fleet.ServedModel{{llama, ad("team-x", "other")}, {llama}}, cfg: config.LoRAConfig{Adapters: []string{"team-*"}}, model: "team-x", servers: []string{"a"}},
		{name: "parents overridden", lists: [][]fleet.ServedModel{{llama, ad("sql", "llama")}, {llama}}, cfg: config.LoRAConfig{Parents: []string{"base"}}, model: "sql", absent: true},
		{name: "running adapter the list lacks", lists: [][]fleet.ServedModel{{llama}, {llama}}, lora: []*fleet.LoRAState{nil, {Running: []string{"hot"}}}, model: "hot", servers: []string{"b"}},
		{name: "alias nobody serves: 404", lists: [][]fleet.ServedModel{{llama}, {llama}}, model: "alias", refuse: RefuseUnknown},
		{name: "unrelated list keeps base models", lists: [][]fleet.ServedModel{{{ID: "whatever"}}, {llama}}, model: "alias", servers: []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pool(len(tc.lists))
			for i, l := range tc.lists {
				if l != nil {
					listed(p.Endpoints[i], l...)
				}
				if i < len(tc.lora) {
					p.Endpoints[i].SetLoRA(tc.lora[i])
				}
			}
			dc := &config.DeploymentConfig{Name: "llama", Models: []string{"llama", "alias"}, LoRA: tc.cfg}
			tb := Build([]Dep{{Config: dc, Pools: []*fleet.Pool{p}}}, NewSeen(), nil)
			e := tb.Lookup([]byte(tc.model))
			switch {
			case tc.absent:
				if e != nil {
					t.Fatalf("%s routed: %+v", tc.model, e)
				}
				return
			case e == nil:
				t.Fatalf("%s not in the table %v", tc.model, tb.Names)
			case e.Refuse != tc.refuse:
				t.Fatalf("refuse %d, want %d", e.Refuse, tc.refuse)
			case tc.refuse != RefuseNone:
				return
			}
			got := tb.Servers([]Dep{{Config: dc, Pools: []*fleet.Pool{p}}}, tc.model, 0)
			if slices.Equal(tc.servers, []string{"all"}) {
				if e.Only[0] != nil {
					t.Fatalf("mask %v, want nil (every endpoint)", e.Only[0])
				}
				return
			}
			if !slices.Equal(got, tc.servers) {
				t.Fatalf("servers %v, want %v", got, tc.servers)
			}
		})
	}
}

// A name endpoints served and no longer list is refused 503 (Gone), not
// 404; Seen is what tells them apart.
func TestBuildGone(t *testing.T) {
	p := pool(2)
	dc := &config.DeploymentConfig{Name: "llama", Models: []string{"llama"}}
	deps := []Dep{{Config: dc, Pools: []*fleet.Pool{p}}}
	seen := NewSeen()
	listed(p.Endpoints[0], fleet.ServedModel{ID: "llama"}, fleet.ServedModel{ID: "sql", Parent: "llama"})
	if e := Build(deps, seen, nil).Lookup([]byte("sql")); e == nil || e.Refuse != RefuseNone {
		t.Fatalf("served: %+v", e)
	}
	listed(p.Endpoints[0], fleet.ServedModel{ID: "llama"})
	tb := Build(deps, seen, nil)
	if e := tb.Lookup([]byte("sql")); e == nil || e.Refuse != RefuseGone || !e.Adapter || !tb.IsAdapter(e.Idx) {
		t.Fatalf("gone: %+v", e)
	}
	if e := Build(deps, NewSeen(), nil).Lookup([]byte("sql")); e != nil {
		t.Fatalf("never seen: %+v", e)
	}
}
