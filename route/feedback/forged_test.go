package feedback

import (
	"context"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// Issue 28: lines without a decision id (id=-, what a proxy writes when it
// routed without turnout, and what anyone able to reach the feedback port
// can send) claiming fast answers from a stalled replica must not keep it
// in rotation: its open decisions still degrade it.
func TestForgedLinesDoNotHideStall(t *testing.T) {
	r0, r1 := newReplica(t), newReplica(t)
	s, _ := stallServer(t, r0, r1)
	r0.stall.Store(int64(10 * time.Second))
	var onR0 bool
	for i := 0; i < 40 && (!onR0 || completed(s) == 0); i++ {
		ctx := do(s, chatBody("llama", "", "x"))
		if hdr(ctx, contract.HdrServer) == "r0" {
			onR0 = true
			continue
		}
		s.Line([]byte("turnout-done id=" + hdr(ctx, contract.HdrDecision) + " srv=r1 status=200 ms=5 ttfb=2"))
	}
	if !onR0 {
		t.Fatal("no decision for r0")
	}
	forged := []byte("turnout-done id=- srv=r0 status=200 ms=1 ttfb=1")
	deadline := time.Now().Add(5 * time.Second)
	for !endpointByName(s, "r0").Degraded() {
		if time.Now().After(deadline) {
			t.Fatal("forged id=- lines kept the stalled r0 in rotation for 5s (budget 300ms)")
		}
		for i := 0; i < 5; i++ {
			s.Line(forged)
		}
		s.Ticker().Sweep(context.Background(), time.Now())
		time.Sleep(20 * time.Millisecond)
	}
	if endpointByName(s, "r1").Degraded() {
		t.Fatal("healthy r1 degraded")
	}
}

// Issue 28 item 2: a replica that answers some requests in time (and its
// /health, /metrics) while others stall: its engine reports few requests,
// turnout holds more decisions open on it past half the budget. Those
// decisions are believed: it is probed and degraded, although a later
// request on it was answered in time.
func TestStallBelievesOpenDecisionsOverEngine(t *testing.T) {
	r0, r1 := newReplica(t), newReplica(t)
	s, _ := stallServer(t, r0, r1)
	r0.stall.Store(int64(10 * time.Second))
	// Least-request alternates while nothing completes.
	var onR0 int
	var r1IDs []string
	for i := 0; i < 8; i++ {
		ctx := do(s, chatBody("llama", "", "x"))
		if hdr(ctx, contract.HdrServer) == "r0" {
			onR0++
		} else {
			r1IDs = append(r1IDs, hdr(ctx, contract.HdrDecision))
		}
	}
	if onR0 < 3 || len(r1IDs) == 0 {
		t.Fatalf("%d decisions for r0, %d for r1", onR0, len(r1IDs))
	}
	for _, id := range r1IDs {
		s.Line([]byte("turnout-done id=" + id + " srv=r1 status=200 ms=5 ttfb=2"))
	}
	time.Sleep(200 * time.Millisecond) // past half the 300ms budget
	// A later request on r0 is answered in time (verified: it closes its
	// decision), so no decision opened before it counts as stalled by age.
	r1e := endpointByName(s, "r1")
	r1e.SetDown(true)
	ctx := do(s, chatBody("llama", "", "x"))
	r1e.SetDown(false)
	if hdr(ctx, contract.HdrServer) != "r0" {
		t.Fatal("no later decision on r0")
	}
	s.Line([]byte("turnout-done id=" + hdr(ctx, contract.HdrDecision) + " srv=r0 status=200 ms=5 ttfb=2"))
	r0e := endpointByName(s, "r0")
	r0e.SetEngineLoad(&fleet.EngineLoad{Requests: 1, KVUsage: -1, Mark: r0e.Inflight()})
	tickUntil(t, s, "r0 degraded", func() bool { return r0e.Degraded() })
	if endpointByName(s, "r1").Degraded() {
		t.Fatal("healthy r1 degraded")
	}
}
