package feedback

import (
	"fmt"
	"strings"
	"time"

	"github.com/turnout/turnout/internal/promtext"
	"github.com/turnout/turnout/route/fleet"
)

// Per-endpoint figures from completion feedback: status classes and request
// durations (ms=), times to the response headers (ttfb=) and to the first
// body bytes (tft=). Fixed arrays of atomics,
// so the feedback path does not allocate.

// writeEndpointFeedbackMetrics renders the per-endpoint feedback metrics.
func (l *Loop) writeEndpointMetrics(b *strings.Builder) {
	snap := l.d.Snapshot()
	help := promtext.Helper(b)
	help("turnout_endpoint_decisions_expired_total", "counter", "Decisions closed without a completion (decision_ttl or slot reuse): lost feedback.")
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			fmt.Fprintf(b, "turnout_endpoint_decisions_expired_total{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, e.Name, e.State.Expired.Load())
		}
	}
	help("turnout_endpoint_responses_total", "counter", "Responses per endpoint by status class, from completion feedback (other: no response).")
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			for c, name := range fleet.StatusClasses {
				fmt.Fprintf(b, "turnout_endpoint_responses_total{deployment=%q,pool=%q,endpoint=%q,class=%q} %d\n", p.Deployment, p.Name, e.Name, name, e.State.Feedback.Classes[c].Load())
			}
		}
	}
	for _, h := range []struct {
		name, text string
		get        func(*fleet.State) *fleet.MsHistogram
	}{
		{"turnout_endpoint_request_duration_seconds", "Request duration per endpoint as the proxy saw it (feedback ms=).", func(st *fleet.State) *fleet.MsHistogram { return &st.Feedback.Duration }},
		{"turnout_endpoint_ttfb_seconds", "Time to the replica's response headers per endpoint (feedback ttfb=).", func(st *fleet.State) *fleet.MsHistogram { return &st.Feedback.TTFB }},
		{"turnout_endpoint_first_token_seconds", "Time from the request's arrival at the proxy to the replica's first response body bytes per endpoint (feedback tft=, /internal/done tft).", func(st *fleet.State) *fleet.MsHistogram { return &st.Feedback.FirstToken }},
	} {
		help(h.name, "histogram", h.text)
		for _, p := range snap.Pools() {
			for _, e := range p.Endpoints {
				hist := h.get(e.State)
				promtext.Histogram(b, h.name, fmt.Sprintf("deployment=%q,pool=%q,endpoint=%q", p.Deployment, p.Name, e.Name),
					fleet.RequestBuckets[:], 1, hist.Counts[:], float64(hist.SumMs.Load())/1e3)
			}
		}
	}
}

// writeMetrics renders the feedback loop's metrics (Decider.AddMetrics).
func (l *Loop) writeMetrics(b *strings.Builder) {
	fmt.Fprintf(b, "# HELP turnout_feedback_lines_total Proxy log lines received on the feedback listener.\n# TYPE turnout_feedback_lines_total counter\n")
	fmt.Fprintf(b, "turnout_feedback_lines_total{result=\"ok\"} %d\n", l.lines.Load())
	fmt.Fprintf(b, "turnout_feedback_lines_total{result=\"malformed\"} %d\n", l.bad.Load())
	l.writeEndpointMetrics(b)
	l.writeHealthMetrics(b)
}

// writeHealthMetrics renders the feedback and stall gauges.
func (l *Loop) writeHealthMetrics(b *strings.Builder) {
	help := promtext.Helper(b)
	stalled := 0
	if l.mon.stalled.Load() {
		stalled = 1
	}
	help("turnout_feedback_stalled", "gauge", "1 when completions stopped arriving while decisions are made (feedback.stalled_after).")
	fmt.Fprintf(b, "turnout_feedback_stalled %d\n", stalled)
	help("turnout_feedback_last_completion_age_seconds", "gauge", "Time since a completion last arrived (0 while they arrive; counted from start).")
	fmt.Fprintf(b, "turnout_feedback_last_completion_age_seconds %g\n", time.Duration(l.mon.ageNs.Load()).Seconds())
	help("turnout_feedback_rejected_total", "counter", "Feedback datagrams or lines dropped: source not in feedback.sources, or missing/wrong token.")
	fmt.Fprintf(b, "turnout_feedback_rejected_total %d\n", l.rejected.Load())
	help("turnout_stall_probes_total", "counter", "Stall probes by result (stalled: no answer within the budget).")
	fmt.Fprintf(b, "turnout_stall_probes_total{result=\"ok\"} %d\n", l.stallProbes[0].Load())
	fmt.Fprintf(b, "turnout_stall_probes_total{result=\"stalled\"} %d\n", l.stallProbes[1].Load())
	help("turnout_endpoint_degraded", "gauge", "1 when stall detection took the endpoint out of rotation.")
	fleet.WriteEndpointSeries(b, l.d.Snapshot().Pools(), "turnout_endpoint_degraded", func(e *fleet.Endpoint) float64 { return fleet.Flag(e.Degraded()) })
	help("turnout_endpoint_stall_limit_seconds", "gauge", "Time to first byte an endpoint must meet before stall detection probes it: health.stall.scale x its p99 first-token time, within health.stall.floor..budget (0: detection off).")
	fleet.WriteEndpointSeries(b, l.d.Snapshot().Pools(), "turnout_endpoint_stall_limit_seconds", func(e *fleet.Endpoint) float64 {
		return time.Duration(e.State.Stall.Limit()).Seconds()
	})
}
