package fleet

import "testing"

// Admits: one more request starts at once only where the engine reported
// no waiting request and the load is below what it ran when it last
// queued; no engine figure, no promise.
func TestEndpointAdmits(t *testing.T) {
	e := &Endpoint{Name: "e", State: &State{}}
	if e.Admits(e.Load()) {
		t.Fatal("admits without an engine figure")
	}
	scrape := func(requests, waiting int64) {
		e.SetEngineLoad(&EngineLoad{Requests: requests, Waiting: waiting, KVUsage: -1, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
	}
	scrape(5, 0)
	if !e.Admits(e.Load()) {
		t.Fatal("an engine that never queued does not admit")
	}
	scrape(10, 2) // queueing: it runs 8 at once
	if e.Admits(e.Load()) {
		t.Fatal("admits while the engine queues")
	}
	scrape(7, 0)
	if !e.Admits(e.Load()) {
		t.Fatal("7 running of 8 does not admit")
	}
	e.AddInflight(1) // one more sent since the scrape: 8 of 8
	if e.Admits(e.Load()) {
		t.Fatal("admits at the capacity learnt from the last queue")
	}
	e.AddPeerLoad(-1) // a peer's request finished: 7 again
	if !e.Admits(e.Load()) {
		t.Fatal("a peer's finished request not counted")
	}
}
