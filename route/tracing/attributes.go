package tracing

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/turnout/turnout/route"
)

// The decision span's attributes (docs/tracing.md lists them).
const (
	AttrDecision     = "turnout.decision.id"
	AttrModel        = "gen_ai.request.model"
	AttrDeployment   = "turnout.deployment"
	AttrPool         = "turnout.pool"
	AttrPolicy       = "turnout.policy"
	AttrOutcome      = "turnout.outcome"
	AttrEndpoint     = "turnout.endpoint"
	AttrAddress      = "turnout.endpoint.address"
	AttrFallbacks    = "turnout.fallbacks"
	AttrMatched      = "turnout.prefix.matched_blocks"
	AttrHeldMs       = "turnout.flow.held_ms"
	AttrPrefill      = "turnout.prefill.endpoint"
	AttrPrefillMs    = "turnout.prefill.duration_ms"
	AttrStatus       = "http.response.status_code"
	AttrReason       = "turnout.reason"
	msPerNanosecond  = 1e-6
	maxAttrModelSize = 256
)

// Attributes are the span attributes of a decision; empty facts are left
// out (no pool before a deployment, no endpoint on a refusal).
func Attributes(s *route.DecisionSpan) []attribute.KeyValue {
	v := s.Verdict
	a := make([]attribute.KeyValue, 0, 16)
	a = append(a, attribute.Int(AttrStatus, v.Status))
	if len(s.Model) > 0 {
		a = append(a, attribute.String(AttrModel, string(s.Model[:min(len(s.Model), maxAttrModelSize)])))
	}
	if s.Deployment != "" {
		a = append(a, attribute.String(AttrDeployment, s.Deployment))
	}
	if p := s.Pool; p != nil {
		a = append(a, attribute.String(AttrPool, p.Name), attribute.String(AttrPolicy, p.PolicyName))
	}
	if s.Held > 0 {
		a = append(a, attribute.Float64(AttrHeldMs, float64(s.Held)*msPerNanosecond))
	}
	if s.PrefillTime > 0 {
		a = append(a, attribute.Float64(AttrPrefillMs, float64(s.PrefillTime)*msPerNanosecond))
	}
	if !v.Routed() {
		a = append(a, attribute.String(AttrReason, v.Reason))
		return a
	}
	a = append(a,
		attribute.String(AttrDecision, string(v.DecisionHex())),
		attribute.String(AttrEndpoint, string(v.Server)),
		attribute.String(AttrAddress, string(v.Addr)),
		attribute.Int(AttrFallbacks, len(v.Fallbacks)))
	if s.Picked {
		a = append(a, attribute.String(AttrOutcome, s.Outcome.String()), attribute.Int(AttrMatched, s.Matched))
	}
	if len(v.Prefill) > 0 {
		a = append(a, attribute.String(AttrPrefill, string(v.Prefill)))
	}
	return a
}
