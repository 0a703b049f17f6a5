package fleet

import "testing"

// Issue 27: between scrapes a front counts the change of its peers'
// in-flight counts for an endpoint into the load, from the scrape on (not
// the requests the engine had already counted), alongside its own.
func TestLoadCountsPeerInflightSinceScrape(t *testing.T) {
	e := &Endpoint{State: &State{}}
	e.AddPeerLoad(1) // before the scrape: in the engine's figure already
	e.AddInflight(1)
	if got := e.Load(); got != 1 {
		t.Fatalf("without a scrape Load is the in-flight count: %d, want 1", got)
	}
	e.SetEngineLoad(&EngineLoad{Requests: 5, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
	if got := e.Load(); got != 5 {
		t.Fatalf("at the scrape Load %d, want the engine's 5", got)
	}
	e.AddPeerLoad(3)
	e.AddPeerLoad(-1)
	e.AddInflight(1)
	if got := e.Load(); got != 8 {
		t.Fatalf("after peers' in-flight +2 and 1 own, Load %d, want 8", got)
	}
	e.AddPeerLoad(-9) // a peer reports completions the scrape had counted
	if got := e.Load(); got != 0 {
		t.Fatalf("Load %d below zero, want 0", got)
	}
	e.AddPeerLoad(9)
	e.SetEngineLoad(&EngineLoad{Requests: 3, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
	if got := e.Load(); got != 3 {
		t.Fatalf("the next scrape counts them itself: Load %d, want 3", got)
	}
}
