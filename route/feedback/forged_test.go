package feedback

import (
	"context"
	"testing"
	"time"

	"github.com/turnout/turnout/route"
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
		if hdr(ctx, route.HdrServer) == "r0" {
			onR0 = true
			continue
		}
		s.Line([]byte("turnout-done id=" + hdr(ctx, route.HdrDecision) + " srv=r1 status=200 ms=5 ttfb=2"))
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
		s.Sweep(context.Background(), time.Now())
		time.Sleep(20 * time.Millisecond)
	}
	if endpointByName(s, "r1").Degraded() {
		t.Fatal("healthy r1 degraded")
	}
}
