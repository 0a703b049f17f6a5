package route

import (
	"time"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// Tracer receives every finished decision while tracing is on
// (route/tracing exports it as an OpenTelemetry span). It runs on the
// decision's goroutine: it must not block (hand the span to a batcher) and
// must not keep the DecisionSpan or its views.
type Tracer interface {
	Decided(s *DecisionSpan)
}

// DecisionSpan is what one decision's span reports (docs/tracing.md). The
// slices are views into the request and the Verdict, valid only during
// Tracer.Decided.
type DecisionSpan struct {
	// Traceparent and Tracestate are the client's W3C trace context (nil:
	// not sent).
	Traceparent, Tracestate []byte
	// Arrival is when the request reached turnout, End when the verdict
	// was made; Held is the part of it flow control held the request.
	Arrival, End time.Time
	Held         time.Duration
	// Model is the request's model (nil: none), Deployment the deployment
	// it selected ("" when refused before).
	Model      []byte
	Deployment string
	// Pool is the serving pool whose policy picked (nil when the request
	// was refused before a pick); Picked says Outcome and Matched are its
	// pick's.
	Pool    *fleet.Pool
	Picked  bool
	Outcome fleet.Outcome
	Matched int
	// PrefillTime is the prefill call's duration (prefill/decode; 0: none ran).
	PrefillTime time.Duration
	// Verdict is the answer: the endpoint, the decision id, the prefill
	// server, or a refusal's status and reason.
	Verdict *contract.Verdict
}

// SetTracer installs (or, with nil, removes) the decision tracer: beside
// the request log, what is recorded of each decision.
func (l *Ledger) SetTracer(tr Tracer) { l.tracer.set(tr) }

// traceDecision hands the finished decision to tr. Called only with
// tracing on: what it reads is gathered here, not on the decision's way.
func (t *Txn) traceDecision(tr Tracer, in *contract.Input, v *contract.Verdict, arrival time.Time) {
	s := &t.span
	*s = DecisionSpan{Arrival: arrival, End: time.Now(), Held: t.held, Model: t.req.Model, PrefillTime: t.prefillTime, Verdict: v}
	for i := range in.Headers {
		h := &in.Headers[i]
		switch {
		case contract.HeaderIs(h.Name, traceparentNorm):
			s.Traceparent = h.Value
		case contract.HeaderIs(h.Name, tracestateNorm):
			s.Tracestate = h.Value
		}
	}
	if dep := t.dep; dep != nil {
		s.Deployment = dep.Name
		switch {
		case v.Status == 200:
			c := &t.choices[0]
			s.Pool, s.Picked, s.Outcome, s.Matched = dep.Serve, true, c.Outcome, c.Matched
		case t.refusedPool != nil:
			s.Pool = t.refusedPool
		}
	}
	tr.Decided(s)
	*s = DecisionSpan{}
}

// The trace context headers, normalized.
var (
	traceparentNorm = contract.NormHeader([]byte(contract.FwdTraceparent))
	tracestateNorm  = contract.NormHeader([]byte(contract.FwdTracestate))
)
