package policy

import (
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
)

func loraPolicy(t *testing.T, p *fleet.Pool) fleet.Policy {
	t.Helper()
	pol, err := NewLoRAAffinityFactory()(&config.PolicyConfig{Name: LoRAAffinityType}, fleet.PolicyEnv{Pool: p, Rand: fleet.NewRand(3)})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func adapterReq(name string) *fleet.Request {
	return &fleet.Request{Model: []byte(name), Adapter: true, AdapterHash: fleet.HashKey([]byte(name))}
}

// Issue 25: an adapter request goes where the adapter is hot (engine
// report or this policy's own decisions), else where a slot is free, else
// to the least loaded; a hot replica loses it only past weight requests
// of extra load; base-model requests are least-request's.
func TestLoRAAffinity(t *testing.T) {
	for _, tc := range []struct {
		name    string
		loads   []int64
		lora    []*fleet.LoRAState // engine reports by endpoint
		adapter string
		want    string
	}{
		{"running on e2", []int64{0, 0, 3}, []*fleet.LoRAState{nil, nil, {Running: []string{"sql"}, MaxLoRA: 4}}, "sql", "e2"},
		{"waiting on e1", []int64{0, 2, 0}, []*fleet.LoRAState{nil, {Waiting: []string{"sql"}, MaxLoRA: 4}, nil}, "sql", "e1"},
		{"hot but 9 more requests than the least loaded (weight 8)", []int64{0, 9, 1}, []*fleet.LoRAState{nil, {Running: []string{"sql"}, MaxLoRA: 4}, nil}, "sql", "e0"},
		{"not hot: a free slot beats a full one", []int64{0, 1, 0},
			[]*fleet.LoRAState{{Running: []string{"a", "b"}, MaxLoRA: 2}, {Running: []string{"c"}, MaxLoRA: 2}, {Running: []string{"d", "e"}, MaxLoRA: 2}}, "sql", "e1"},
		{"every slot full: the least loaded", []int64{4, 1, 2},
			[]*fleet.LoRAState{{Running: []string{"a"}, MaxLoRA: 1}, {Running: []string{"b"}, MaxLoRA: 1}, {Running: []string{"c"}, MaxLoRA: 1}}, "sql", "e1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := routetest.Pool(t, len(tc.loads), func(p *fleet.Pool) fleet.Policy { return loraPolicy(t, p) })
			for i, l := range tc.loads {
				p.Endpoints[i].AddInflight(l)
				p.Endpoints[i].SetLoRA(tc.lora[i])
			}
			if got := routetest.Names(routetest.Choose(p, adapterReq(tc.adapter), 1).Endpoints); got != tc.want {
				t.Fatalf("picked %q, want %s", got, tc.want)
			}
		})
	}
}

// Between scrapes the policy's own decisions make an adapter hot: the
// next requests for it follow.
func TestLoRAAffinityRemembers(t *testing.T) {
	p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { return loraPolicy(t, p) })
	first := routetest.Names(routetest.Choose(p, adapterReq("sql"), 1).Endpoints)
	for i := range 10 {
		if got := routetest.Names(routetest.Choose(p, adapterReq("sql"), 1).Endpoints); got != first {
			t.Fatalf("request %d for sql went to %s, the first to %s", i, got, first)
		}
	}
	// Base-model requests: any available endpoint, fallbacks filled.
	if got := routetest.Choose(p, &fleet.Request{Model: []byte("llama")}, 3).Endpoints; len(got) != 3 {
		t.Fatalf("base model: %d endpoints", len(got))
	}
	// The model mask binds the policy too.
	only := fleet.NewMask(4)
	only.Set(3)
	r := adapterReq("sql")
	r.Only = only
	if got := routetest.Names(routetest.Choose(p, r, 3).Endpoints); got != "e3" {
		t.Fatalf("masked: %q, want e3 alone", got)
	}
}
