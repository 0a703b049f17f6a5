package policy

import (
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"testing"
)

func TestEngineQueueScorer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		engine   *fleet.EngineLoad // nil: no scrape
		inflight int64
		want     float64
	}{
		{"no scrape: in-flight decisions", nil, 3, -3},
		{"engine queue", &fleet.EngineLoad{Requests: 7, KVUsage: -1}, 0, -7},
		{"engine figure, not in-flight", &fleet.EngineLoad{Requests: 2, KVUsage: 0.5}, 5, -2},
		{"idle", &fleet.EngineLoad{KVUsage: -1}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := goldenPool(1).Endpoints[0]
			e.AddInflight(tc.inflight)
			e.SetEngineLoad(tc.engine)
			if got := (EngineQueue{}).Score(&Cycle{}, e); got != tc.want {
				t.Fatalf("score %v, want %v", got, tc.want)
			}
		})
	}
}

// A policy of the engine-queue scorer alone, composed inline: the replica
// with the shortest engine queue gets the request, the next shortest is
// the first fallback when fallbacks are by score.
func TestEngineQueueDecides(t *testing.T) {
	cfg := mustConfig(t, `
deployments:
  - name: d
    policy:
      stages:
        scorers: [{name: engine-queue}]
        fallbacks: score
    pools:
      - endpoints:
          - {name: e0, address: 127.0.0.1:8000}
          - {name: e1, address: 127.0.0.1:8001}
          - {name: e2, address: 127.0.0.1:8002}
`)
	pool := goldenPool(3)
	pol, err := DefaultRegistry().Build(&cfg.Deployments[0].Policy, fleet.PolicyEnv{Pool: pool, Rand: fleet.NewRand(1)})
	if err != nil {
		t.Fatal(err)
	}
	if la, ok := pol.(fleet.LoadAware); !ok || !la.LoadAware() {
		t.Fatal("a composed policy balances on in-flight counts: it must say so (feedback warnings)")
	}
	for i, q := range []int64{9, 1, 4} {
		pool.Endpoints[i].SetEngineLoad(&fleet.EngineLoad{Requests: q, KVUsage: -1})
	}
	c := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, 3)}
	pol.Pick(&fleet.Request{}, pool, c)
	if got := routetest.Names(c.Endpoints); got != "e1,e2,e0" || c.Outcome != fleet.OutcomeBalanced {
		t.Fatalf("chose %s (%s), want e1,e2,e0 balanced", got, c.Outcome)
	}
}
