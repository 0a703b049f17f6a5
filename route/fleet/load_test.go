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
	if got := e.Load(); got != 2 {
		t.Fatalf("Load %d, want this instance's own 2 in flight (not below)", got)
	}
	e.AddPeerLoad(9)
	e.SetEngineLoad(&EngineLoad{Requests: 3, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
	if got := e.Load(); got != 3 {
		t.Fatalf("the next scrape counts them itself: Load %d, want 3", got)
	}
}

// A decision the engine's page did not count yet (on its way there, or
// finished there with its completion still coming) keeps counting until
// it shows or completes; one that two pages in a row missed (its
// completion lost) stops counting, as the scrape says, and so does one a
// first page missed (nothing to tell the two apart by).
func TestLoadKeepsDecisionsOnePageMissed(t *testing.T) {
	e := &Endpoint{State: &State{}}
	e.SetEngineLoad(&EngineLoad{})
	e.AddInflight(2)
	// The page shows one of the two: the other is on its way.
	e.SetEngineLoad(&EngineLoad{Requests: 1, Mark: e.DecisionMark()})
	if got := e.Load(); got != 2 {
		t.Fatalf("one decision missing from one page: Load %d, want 2", got)
	}
	// Its completion arrives: one left.
	e.AddInflight(-1)
	if got := e.Load(); got != 1 {
		t.Fatalf("after one completion: Load %d, want 1", got)
	}
	// The next page counts the one still running: nothing missing.
	e.SetEngineLoad(&EngineLoad{Requests: 1, Mark: e.DecisionMark()})
	if got, g := e.Load(), e.Engine().Ghosts; got != 1 || g != 0 {
		t.Fatalf("Load %d ghosts %d, want 1 and 0", got, g)
	}
	// A completion lost: two pages in a row miss one decision.
	e.AddInflight(1)
	e.SetEngineLoad(&EngineLoad{Requests: 1, Mark: e.DecisionMark()})
	if got := e.Load(); got != 2 {
		t.Fatalf("missed by one page: Load %d, want 2", got)
	}
	e.SetEngineLoad(&EngineLoad{Requests: 1, Mark: e.DecisionMark()})
	if got, g := e.Load(), e.Engine().Ghosts; got != 1 || g != 1 {
		t.Fatalf("missed by two pages: Load %d ghosts %d, want 1 and 1 (the engine's figure)", got, g)
	}
	// The ledger closes it (reconciliation): Load stays the engine's.
	e.AddInflight(-1)
	e.State.Unmark(1)
	if got, g := e.Load(), e.Engine().Ghosts; got != 1 || g != 0 {
		t.Fatalf("after Unmark: Load %d ghosts %d, want 1 and 0", got, g)
	}
	// After a failed scrape, the next page is a first one.
	e.SetEngineLoad(nil)
	e.AddInflight(1)
	e.SetEngineLoad(&EngineLoad{Requests: 1, Mark: e.DecisionMark()})
	if got := e.Load(); got != 1 {
		t.Fatalf("a first page: Load %d, want the engine's 1", got)
	}
}
