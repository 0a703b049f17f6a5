package policy

import (
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

func TestLoadGuard(t *testing.T) {
	for _, tc := range []struct {
		name    string
		g       LoadGuard
		load    int64
		minLoad int64
		served  uint64 // the endpoint's; the pool's total is 8 over 4
		want    bool
	}{
		{"at the minimum", LoadGuard{Abs: 4, Rel: 1.5}, 3, 3, 0, true},
		{"within abs", LoadGuard{Abs: 4, Rel: 1.5}, 7, 3, 0, true},
		{"above abs and rel", LoadGuard{Abs: 4, Rel: 1.5}, 8, 3, 0, false},
		{"above abs, within rel", LoadGuard{Abs: 4, Rel: 3}, 8, 3, 0, true},
		{"bounded: within", LoadGuard{Abs: 4, Rel: 1.5, Bounded: 0.25}, 3, 3, 1, true},
		{"bounded: over ceil(1.25*9/4)=3", LoadGuard{Abs: 4, Rel: 1.5, Bounded: 0.25}, 3, 3, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goldenPool(4)
			e := p.Endpoints[0]
			e.AddInflight(tc.load)
			e.StartWindow()
			for range tc.served {
				goldenOpen(e)
			}
			e.AddInflight(-int64(tc.served))
			c := &Cycle{Pool: p, MinLoad: tc.minLoad, Served: 8, N: 4}
			if got := tc.g.Keep(c, e); got != tc.want {
				t.Fatalf("keep %v, want %v", got, tc.want)
			}
		})
	}
}

// MaxScore: the weighted sum ranks, ties go through Ties in order, then
// to the first in scan order; filters drop candidates; a keyed picker
// needs a match and its Accept fraction.
func TestMaxScore(t *testing.T) {
	loads := []int64{2, 0, 0, 5}
	for _, tc := range []struct {
		name string
		m    MaxScore
		want string
	}{
		{"least loaded fill, first of the tied", MaxScore{Scorers: []Weighted{{LoadScore{}, 1}}}, "e1,e2,e0"},
		{"one slot", MaxScore{Scorers: []Weighted{{LoadScore{}, 1}}, Slots: 1}, "e1"},
		{"weight 0: every score ties, scan order", MaxScore{Scorers: []Weighted{{LoadScore{}, 0}}}, "e0,e1,e2"},
		{"tie on lower load", MaxScore{Ties: []Tie{LowerLoad{}}}, "e1,e2,e0"},
		{"filter", MaxScore{Scorers: []Weighted{{LoadScore{}, 1}}, Filters: []Filter{&LoadGuard{Abs: 1, Rel: 1.5}}}, "e1,e2"},
		{"keyed: only matches, best first", MaxScore{Key: fixedKey{0, 1, 3, 3}, Slots: 1}, "e2"},
		{"keyed: under Accept", MaxScore{Key: fixedKey{0, 1, 3, 3}, Accept: 0.9, Slots: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goldenPool(4)
			for i, l := range loads {
				p.Endpoints[i].AddInflight(l)
			}
			ch := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, 3)}
			c := &Cycle{Req: &fleet.Request{}, Pool: p, Choice: ch, MinLoad: 0, N: 4}
			tc.m.Pick(c)
			if got := routetest.Names(ch.Endpoints); got != tc.want {
				t.Fatalf("picked %q, want %q", got, tc.want)
			}
		})
	}
}

// fixedKey is a Keyer with set matches out of 4 blocks.
type fixedKey []int

func (k fixedKey) Match(_ *Cycle, e *fleet.Endpoint) int { return k[e.Index] }
func (k fixedKey) Of(*Cycle) int                         { return 4 }

// A preset defined in the config alone (testdata/preset_prefix_queue.yaml,
// shown in docs/policies.md), loaded through internal/config.
func TestPresetFromConfig(t *testing.T) {
	cfg, err := config.LoadConfigFile(filepath.Join("testdata", "preset_prefix_queue.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pc := &cfg.Deployments[0].Policy
	if pc.Name != "prefix-queue" || pc.Stages == nil || len(pc.Stages.Scorers) != 2 {
		t.Fatalf("policy not resolved to the preset: %+v", pc)
	}
	pool := goldenPool(3)
	pol, err := DefaultRegistry().Build(pc, fleet.PolicyEnv{Pool: pool, Rand: fleet.NewRand(1)})
	if err != nil {
		t.Fatal(err)
	}
	if pu, ok := pol.(fleet.PromptUser); !ok || pu.BlockBytes() != 64 {
		t.Fatalf("a prefix scorer wants the prompt's 64-byte blocks: %T", pol)
	}
	for i, q := range []int64{1, 3, 0} {
		pool.Endpoints[i].SetEngineLoad(&fleet.EngineLoad{Requests: q, KVUsage: -1})
	}
	blocks := []uint64{11, 12, 13, 14}
	pick := func(blocks []uint64) *fleet.Choice {
		c := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, 2)}
		pol.Pick(&fleet.Request{Blocks: blocks}, pool, c)
		return c
	}
	// Nothing cached: the shortest engine queue wins.
	if c := pick(blocks); routetest.Names(c.Endpoints) != "e2,e0" || c.Outcome != fleet.OutcomeBalanced || c.Matched != 0 {
		t.Fatalf("first: %s %s matched %d, want e2,e0 balanced 0", routetest.Names(c.Endpoints), c.Outcome, c.Matched)
	}
	// e2 now holds the prefix: it stays there although e0's queue is as
	// short now (a full match is worth 20 queued requests).
	pool.Endpoints[0].SetEngineLoad(&fleet.EngineLoad{Requests: 0, KVUsage: -1})
	pool.Endpoints[2].SetEngineLoad(&fleet.EngineLoad{Requests: 5, KVUsage: -1})
	if c := pick(blocks); routetest.Names(c.Endpoints)[:2] != "e2" || c.Outcome != fleet.OutcomeAffinity || c.Matched != 4 {
		t.Fatalf("second: %s %s matched %d, want e2 first, affinity, 4", routetest.Names(c.Endpoints), c.Outcome, c.Matched)
	}
	// The load guard: e2 far above the least loaded is not a candidate.
	pool.Endpoints[2].AddInflight(20)
	if c := pick(blocks); routetest.Names(c.Endpoints)[:2] == "e2" {
		t.Fatalf("routed to a replica 20 requests above the others: %s", routetest.Names(c.Endpoints))
	}
}

func TestPresetConfigErrors(t *testing.T) {
	base := func(policy string) string {
		return `
presets:
  - name: p
    stages:
      scorers: [{name: load}]
deployments:
  - name: d
    policy: ` + policy + `
    pools:
      - endpoints: [{name: e0, address: 127.0.0.1:8000}]
`
	}
	for _, tc := range []struct {
		name, policy, want string
		parse              bool // the config itself is invalid
	}{
		{"unknown scorer", "{stages: {scorers: [{name: lod}]}}", `line 8: deployments[0].policy.stages.scorers[0].name: unknown scorer "lod"; did you mean "load"? (known: engine-queue, load, lora-affinity, prefix)`, false},
		{"unknown filter", "{stages: {filters: [{name: guard}], scorers: [{name: load}]}}", `unknown filter "guard"`, false},
		{"bad stage param", "{stages: {scorers: [{name: prefix, params: {block_bytes: 1}}]}}", "prefix-affinity block_bytes 1 out of range", false},
		{"unknown stage param", "{stages: {scorers: [{name: load, params: {x: 1}}]}}", `unknown field "x"`, false},
		{"negative weight", "{stages: {scorers: [{name: load, weight: -1}]}}", "line 8: deployments[0].policy.stages.scorers[0].weight: -1 out of range", true},
		{"no scorer", "{stages: {filters: [{name: load-guard}]}}", "stages.scorers: at least one scorer is required", true},
		{"preset with params", "{name: p, params: {x: 1}}", "is a preset: its params are in its stages", true},
		{"stages with params", "{stages: {scorers: [{name: load}]}, params: {choices: 0}}", "takes its params per stage", true},
		{"bad fallbacks", "{stages: {scorers: [{name: load}], fallbacks: random}}", `"random" must be least-loaded or score`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.ParseConfig([]byte(base(tc.policy)))
			if tc.parse {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("parse error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = DefaultRegistry().Build(&cfg.Deployments[0].Policy, fleet.PolicyEnv{Pool: goldenPool(1)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("build error %v, want %q", err, tc.want)
			}
		})
	}
	// A preset may not take a built-in policy's name.
	cfg := mustConfig(t, strings.Replace(base("{name: round-robin}"), "name: p", "name: round-robin", 1))
	_, err := DefaultRegistry().Build(&cfg.Deployments[0].Policy, fleet.PolicyEnv{Pool: goldenPool(1)})
	if err == nil || !strings.Contains(err.Error(), `preset "round-robin" has the name of a built-in policy`) {
		t.Fatalf("shadowing preset: %v", err)
	}
}

func mustConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	c, err := config.ParseConfig([]byte(y))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

// docs/policies.md shows the worked examples as they are: the config-only
// preset verbatim and the scorer's registration line.
func TestPoliciesDocExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "policies.md"))
	if err != nil {
		t.Fatal(err)
	}
	preset, err := os.ReadFile(filepath.Join("testdata", "preset_prefix_queue.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := os.ReadFile("registry.go")
	if err != nil {
		t.Fatal(err)
	}
	const line = "\tr.Scorer(EngineQueueStage, NewEngineQueueScorer)\n"
	for what, ok := range map[string]bool{
		"the preset YAML":                 strings.Contains(string(doc), "```yaml\n"+string(preset)+"```"),
		"the registration line":           strings.Contains(string(doc), line),
		"the registration line (in code)": strings.Contains(string(reg), line),
	} {
		if !ok {
			t.Errorf("docs/policies.md and the code disagree on %s", what)
		}
	}
}

// Stages are shared by a pool's concurrent decisions; each decision's
// state is its own Cycle (run with -race).
func TestProfileConcurrent(t *testing.T) {
	pool := goldenPool(4)
	pol := NewPrefixAffinity(DefaultPrefixAffinityConfig(), pool, fleet.NewRand(1))
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				r := &fleet.Request{Blocks: []uint64{uint64(i % 7), uint64(g)}, HasSession: i%2 == 0, SessionHash: uint64(i)}
				c := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, 3)}
				pol.Pick(r, pool, c)
				if len(c.Endpoints) != 3 || c.Endpoints[0] == c.Endpoints[1] || c.Endpoints[1] == c.Endpoints[2] || c.Endpoints[0] == c.Endpoints[2] {
					errs <- routetest.Names(c.Endpoints)
					return
				}
				goldenOpen(c.Endpoints[0])
				c.Endpoints[0].AddInflight(-1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("want 3 distinct endpoints, got %q", e)
	}
}

// LeastLoaded is MaxScore of LoadScore with FewerRecent ties, written out
// for speed: on random pools both pick the same endpoints, drawing the
// same random numbers.
func TestLeastLoadedIsMaxScore(t *testing.T) {
	src := fleet.NewRand(99)
	for round := range 500 {
		p := goldenPool(1 + src.Intn(6))
		for _, e := range p.Endpoints {
			e.AddInflight(int64(src.Intn(3)))
			e.StartWindow()
			for range src.Intn(3) {
				goldenOpen(e)
			}
			e.SetDown(src.Intn(5) == 0)
		}
		slots := 1 + src.Intn(3)
		run := func(pk Picker) string {
			ch := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, slots)}
			pk.Pick(&Cycle{Req: &fleet.Request{}, Pool: p, Choice: ch})
			return routetest.Names(ch.Endpoints)
		}
		seed := uint64(round)
		got := run(NewLeastLoaded(fleet.NewRand(seed)))
		want := run(&MaxScore{Scorers: []Weighted{{LoadScore{}, 1}}, Ties: []Tie{FewerRecent{}}, Rand: fleet.NewRand(seed)})
		if got != want {
			t.Fatalf("round %d: LeastLoaded %q, MaxScore %q", round, got, want)
		}
	}
}

// Zero allocations per decision, for every preset and a composed policy
// (the handler-level test in route covers the built-ins end to end).
func TestPickAllocs(t *testing.T) {
	cfg, err := config.LoadConfigFile(filepath.Join("testdata", "preset_prefix_queue.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{RoundRobinType, LeastRequestType, SessionHashType, PrefixAffinityType, "prefix-queue"} {
		t.Run(name, func(t *testing.T) {
			pool := goldenPool(4)
			pc := &cfg.Deployments[0].Policy
			if name != "prefix-queue" {
				pc = &config.PolicyConfig{Name: name}
			}
			pol, err := DefaultRegistry().Build(pc, fleet.PolicyEnv{Pool: pool, Rand: fleet.NewRand(1)})
			if err != nil {
				t.Fatal(err)
			}
			r := &fleet.Request{Blocks: []uint64{1, 2, 3, 4}, HasSession: true, SessionHash: 42}
			c := &fleet.Choice{}
			dst := make([]*fleet.Endpoint, 0, 3)
			run := func() {
				*c = fleet.Choice{Endpoints: dst}
				pol.Pick(r, pool, c)
				goldenOpen(c.Endpoints[0])
				c.Endpoints[0].AddInflight(-1)
			}
			for range 50 {
				run()
			}
			if n := testing.AllocsPerRun(200, run); n != 0 {
				t.Fatalf("%v allocations per decision", n)
			}
		})
	}
}
