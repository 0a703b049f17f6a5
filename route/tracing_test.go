package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

const testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// With tracing off (no tracing section) a request that carries a W3C
// traceparent still decides without allocating.
func TestDecisionAllocsTracingOff(t *testing.T) {
	ctx := routeCtx(body4K(1), "user-1")
	ctx.Request.Header.Set(contract.FwdTraceparent, testTraceparent)
	ctx.Request.Header.Set(contract.FwdTracestate, "vendor=x")
	assertZeroAllocs(t, mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity")), ctx)
}

// spanCopy keeps what a Tracer saw of one decision (the DecisionSpan's
// views are valid only during Decided).
type spanCopy struct {
	parent, state, model, server string
	deployment, pool             string
	picked                       bool
	outcome                      fleet.Outcome
	matched, status              int
	reason                       string
	arrival, end                 time.Time
}

type recordingTracer struct{ got []spanCopy }

var _ Tracer = (*recordingTracer)(nil)

func (r *recordingTracer) Decided(s *DecisionSpan) {
	c := spanCopy{parent: string(s.Traceparent), state: string(s.Tracestate), model: string(s.Model), server: string(s.Verdict.Server),
		deployment: s.Deployment, picked: s.Picked, outcome: s.Outcome, matched: s.Matched, status: s.Verdict.Status,
		reason: s.Verdict.Reason, arrival: s.Arrival, end: s.End}
	if s.Pool != nil {
		c.pool = s.Pool.Name
	}
	r.got = append(r.got, c)
}

// With tracing on, the trace context headers are forwarded and the tracer
// sees every decision: a routed one with its pick (deployment, pool,
// outcome, matched blocks, endpoint) and the client's traceparent and
// tracestate, a refused one with its status and reason and no pick.
func TestTracerSeesDecision(t *testing.T) {
	s := mustServer(t, "tracing: {endpoint: '127.0.0.1:4317'}\n"+fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	rec := &recordingTracer{}
	s.Ledger().SetTracer(rec)
	for i := range 2 { // the second one hits the first one's prefix
		ctx := routeCtx(body4K(1), fmt.Sprint("user-", i))
		ctx.Request.Header.Set("Traceparent", testTraceparent)
		ctx.Request.Header.Set("tracestate", "vendor=x")
		handle(s, ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
	ctx := routeCtx(`{"model":"nope","prompt":"x"}`, "")
	handle(s, ctx)
	if len(rec.got) != 3 {
		t.Fatalf("%d decisions traced, want 3", len(rec.got))
	}
	hit := rec.got[1]
	if hit.parent != testTraceparent || hit.state != "vendor=x" || hit.deployment != "llama" || hit.pool != "llama_mixed" ||
		!hit.picked || hit.outcome != fleet.OutcomeAffinity || hit.matched == 0 || hit.server == "" || hit.status != 200 || hit.model != "llama" {
		t.Errorf("routed: %+v", hit)
	}
	if hit.end.Before(hit.arrival) || hit.arrival.IsZero() {
		t.Errorf("times: arrival %v end %v", hit.arrival, hit.end)
	}
	if ref := rec.got[2]; ref.status != 404 || ref.reason != "model_not_found" || ref.picked || ref.pool != "" || ref.parent != "" {
		t.Errorf("refused: %+v", ref)
	}
	s.Ledger().SetTracer(nil)
	handle(s, routeCtx(body4K(2), ""))
	if len(rec.got) != 3 {
		t.Errorf("a removed tracer still saw a decision")
	}
}

// The trace context is forwarded (ForwardedHeaders) only with tracing on.
func TestTraceHeadersForwardedOnlyWhenOn(t *testing.T) {
	off := mustServer(t, fmt.Sprintf(fourEndpoints, "round-robin")).Snapshot()
	on := mustServer(t, "tracing: {endpoint: '127.0.0.1:4317'}\n"+fmt.Sprintf(fourEndpoints, "round-robin")).Snapshot()
	for _, h := range []string{"traceparent", "Tracestate"} {
		if off.Forwarded([]byte(h)) {
			t.Errorf("%s forwarded with tracing off", h)
		}
		if !on.Forwarded([]byte(h)) {
			t.Errorf("%s not forwarded with tracing on", h)
		}
	}
}
