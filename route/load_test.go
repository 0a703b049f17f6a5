package route

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// Load = engine figure + this instance's in-flight change since the scrape;
// without an engine figure, the in-flight count.
func TestEndpointLoad(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	e := s.Snapshot().Deployments[0].Serve.Endpoints[0]
	e.AddInflight(3)
	if e.Load() != 3 {
		t.Fatalf("no engine figure: load %d, want in-flight 3", e.Load())
	}
	e.SetEngineLoad(&fleet.EngineLoad{Requests: 20, KVUsage: 0.5, Mark: e.DecisionMark()})
	if e.Load() != 20 {
		t.Fatalf("engine figure: load %d, want 20", e.Load())
	}
	var ids []uint64
	for i := 0; i < 2; i++ {
		ids = append(ids, s.dec.open(e, 0, &decisionMeta{model: -1}))
	}
	if e.Load() != 22 {
		t.Fatalf("two decisions after the scrape: load %d, want 22", e.Load())
	}
	s.Ledger().Complete(ids[0])
	if e.Load() != 21 {
		t.Fatalf("one of them completed: load %d, want 21", e.Load())
	}
	// Completions of requests the engine had counted bring it down, never below 0.
	e.AddInflight(-40)
	if e.Load() != 0 {
		t.Fatalf("load %d after many completions, want 0", e.Load())
	}
	e.AddInflight(40)
	e.SetEngineLoad(nil)
	if e.Load() != 4 {
		t.Fatalf("engine figure dropped: load %d, want in-flight 4", e.Load())
	}
}

// A replica whose engine reports a queue gets no request from least-request
// (global minimum), session-hash or prefix-affinity, although this instance
// has nothing in flight there.
func TestEngineLoadSteersEveryPolicy(t *testing.T) {
	for _, pol := range []string{"least-request", "least-request, params: {choices: 0}", "session-hash", "prefix-affinity"} {
		t.Run(pol, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(fourEndpoints, pol))
			eps := s.Snapshot().Deployments[0].Serve.Endpoints
			for _, e := range eps {
				e.SetEngineLoad(&fleet.EngineLoad{Requests: 2, Mark: e.DecisionMark()})
			}
			busy := eps[1]
			busy.SetEngineLoad(&fleet.EngineLoad{Requests: 20, Mark: busy.DecisionMark()})
			for i := 0; i < 40; i++ {
				ctx := do(s, chatBody("llama", "", fmt.Sprintf("question %d", i)), "X-Session-ID", fmt.Sprintf("u%d", i))
				if got := hdr(ctx, contract.HdrServer); got == busy.Name {
					t.Fatalf("request %d sent to %s, whose engine reports 20 waiting", i, got)
				}
				if id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision))); !s.Ledger().Complete(id) {
					t.Fatal("decision not completable")
				}
			}
		})
	}
}

// Among equally loaded endpoints a new prompt goes to the one with the
// fewest decisions since the last scrape attempt, so requests too short to
// show as load still spread; with no scraper, ties rotate at random.
func TestTieBreakRecentDecisions(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request, params: {choices: 0}"))
	eps := s.Snapshot().Deployments[0].Serve.Endpoints
	for _, e := range eps {
		e.StartWindow()
	}
	counts := map[string]int{}
	for i := 0; i < 40; i++ {
		ctx := do(s, chatBody("llama", "", fmt.Sprintf("q%d", i)))
		counts[hdr(ctx, contract.HdrServer)]++
		id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
		s.Ledger().Complete(id) // load back to 0: only the recent count differs
	}
	for _, e := range eps {
		if counts[e.Name] != 10 {
			t.Fatalf("40 sequential requests spread %v, want 10 each", counts)
		}
	}
}
