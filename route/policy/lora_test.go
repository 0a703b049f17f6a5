package policy

import (
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"gopkg.in/yaml.v3"
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

func loraPolicyParams(t *testing.T, p *fleet.Pool, params string) fleet.Policy {
	t.Helper()
	var pc config.PolicyConfig
	if err := yaml.Unmarshal([]byte("{name: lora-affinity, params: "+params+"}"), &pc); err != nil {
		t.Fatal(err)
	}
	pol, err := NewLoRAAffinityFactory()(&pc, fleet.PolicyEnv{Pool: p, Rand: fleet.NewRand(3)})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// Among the replicas where the adapter is hot, the one holding the prompt
// wins by up to prefix_weight requests of load; a replica holding the
// prompt but not the adapter (its slots full) beats a hot one only when
// prefix_weight exceeds weight (as the default 16 does); base-model requests follow the
// prefix with base_prefix (default off). prefix_weight 0 is the
// adapter-only policy.
func TestLoRAAffinityFollowsPrefix(t *testing.T) {
	blocks := []uint64{11, 12, 13, 14}
	full := &fleet.LoRAState{Running: []string{"a", "b"}, MaxLoRA: 2}
	hot := &fleet.LoRAState{Running: []string{"sql"}, MaxLoRA: 2}
	for _, tc := range []struct {
		name   string
		params string
		loads  []int64
		lora   []*fleet.LoRAState
		holder int // endpoint sent the prompt before
		base   bool
		want   string // "!e": anything but e
	}{
		{"hot on e1 and e2, prompt on e2 one request busier", "{prefix_weight: 4}", []int64{0, 0, 1, 0}, []*fleet.LoRAState{full, hot, hot, full}, 2, false, "e2"},
		{"prefix_weight 0: the less loaded hot replica", "{prefix_weight: 0}", []int64{0, 0, 1, 0}, []*fleet.LoRAState{full, hot, hot, full}, 2, false, "e1"},
		{"default prefix_weight 16: the hot replica holding the prompt, one request busier", "{}", []int64{0, 0, 1, 0}, []*fleet.LoRAState{full, hot, hot, full}, 2, false, "e2"},
		{"default: a replica holding the prompt but not the adapter beats a hot one", "{}", []int64{0, 0, 0, 0}, []*fleet.LoRAState{full, hot, full, full}, 2, false, "e2"},
		{"prompt past prefix_weight requests of extra load", "{prefix_weight: 4}", []int64{0, 0, 5, 0}, []*fleet.LoRAState{full, hot, hot, full}, 2, false, "e1"},
		{"prompt on a replica without the adapter, prefix_weight < weight", "{prefix_weight: 4}", []int64{0, 0, 0, 0}, []*fleet.LoRAState{full, hot, full, full}, 2, false, "e1"},
		{"prompt on a replica without the adapter, prefix_weight > weight", "{prefix_weight: 16}", []int64{0, 0, 0, 0}, []*fleet.LoRAState{full, hot, full, full}, 2, false, "e2"},
		{"base model follows the prompt with base_prefix", "{prefix_weight: 4, base_prefix: true}", []int64{0, 0, 2, 0}, []*fleet.LoRAState{nil, nil, nil, nil}, 2, true, "e2"},
		{"base model without base_prefix (the default): not two requests busier", "{prefix_weight: 4}", []int64{0, 0, 2, 0}, []*fleet.LoRAState{nil, nil, nil, nil}, 2, true, "!e2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := routetest.Pool(t, len(tc.loads), func(p *fleet.Pool) fleet.Policy { return loraPolicyParams(t, p, tc.params) })
			for i, l := range tc.loads {
				p.Endpoints[i].AddInflight(l)
				p.Endpoints[i].SetLoRA(tc.lora[i])
			}
			r := adapterReq("sql")
			if tc.base {
				r = &fleet.Request{Model: []byte("llama")}
			}
			r.Blocks = blocks
			if pr, ok := p.Policy.(fleet.PrefixRecorder); ok {
				pr.RecordPrefix(tc.holder, blocks)
			}
			got := routetest.Names(routetest.Choose(p, r, 1).Endpoints)
			if not, ok := strings.CutPrefix(tc.want, "!"); ok && got == not || !ok && got != tc.want {
				t.Fatalf("picked %q, want %s", got, tc.want)
			}
		})
	}
}

// With the prefix on, the policy asks for block hashes, records its first
// choice's prompt and keeps that index across a reload; with it off it
// hashes nothing, and ReadsPrompt agrees both ways.
func TestLoRAAffinityPrefixIndex(t *testing.T) {
	on := "{prefix_weight: 16, base_prefix: true}"
	p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { return loraPolicyParams(t, p, on) })
	if _, ok := p.Policy.(fleet.PromptUser); !ok {
		t.Fatal("lora-affinity with prefix_weight is not a PromptUser")
	}
	r := &fleet.Request{Model: []byte("llama"), Blocks: []uint64{5, 6, 7}}
	first := routetest.Choose(p, r, 1)
	if first.Matched != 0 {
		t.Fatalf("a new prompt matched %d blocks", first.Matched)
	}
	next := loraPolicyParams(t, p, on)
	next.(fleet.Stater).Carry(p.Policy)
	p.Policy = next
	again := routetest.Choose(p, &fleet.Request{Model: []byte("llama"), Blocks: []uint64{5, 6, 7, 8}}, 1)
	if again.Endpoints[0] != first.Endpoints[0] || again.Matched != 3 {
		t.Fatalf("after a reload: %s matched %d, want %s matched 3", again.Endpoints[0].Name, again.Matched, first.Endpoints[0].Name)
	}
	off := loraPolicyParams(t, p, "{prefix_weight: 0}")
	if _, ok := off.(fleet.PromptUser); ok {
		t.Fatal("prefix_weight 0 still hashes the prompt")
	}
	for params, want := range map[string]bool{"{}": true, "{prefix_weight: 0}": false, "{prefix_weight: 2}": true} {
		var pc config.PolicyConfig
		if err := yaml.Unmarshal([]byte("{name: lora-affinity, params: "+params+"}"), &pc); err != nil {
			t.Fatal(err)
		}
		if got := ReadsPrompt(&pc); got != want {
			t.Errorf("ReadsPrompt(lora-affinity %s) = %v, want %v", params, got, want)
		}
	}
	if _, err := NewLoRAAffinityFactory()(&config.PolicyConfig{Name: LoRAAffinityType}, fleet.PolicyEnv{Pool: p}); err != nil {
		t.Fatal(err)
	}
}
