package route

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
)

// Per-endpoint figures from completion feedback: status classes and request
// durations (ms=) and times to first byte (ttfb=). Fixed arrays of atomics,
// so the feedback path does not allocate.

// requestBuckets are request duration bounds in seconds: LLM requests run
// from tens of milliseconds (cached, short) to minutes (long streams).
var requestBuckets = [...]float64{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// statusClasses are the class label values, indexed by classOf.
var statusClasses = [...]string{"2xx", "3xx", "4xx", "5xx", "other"}

func classOf(status int64) int {
	if status >= 200 && status < 600 {
		return int(status/100) - 2
	}
	return len(statusClasses) - 1 // 1xx, or -1 when the proxy had no response
}

type msHistogram struct {
	counts [len(requestBuckets) + 1]atomic.Uint64
	sumMs  atomic.Uint64
}

func (h *msHistogram) observe(ms int64) {
	sec := float64(ms) / 1e3
	i := 0
	for i < len(requestBuckets) && sec > requestBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumMs.Add(uint64(ms))
}

type endpointFeedback struct {
	classes  [len(statusClasses)]atomic.Uint64
	duration msHistogram
	ttfb     msHistogram
}

// observe records one feedback line for the endpoint (values < 0 are unknown).
func (st *endpointState) observe(status, ms, ttfb, now int64) {
	if status >= 0 {
		st.fb.classes[classOf(status)].Add(1)
	}
	if ms >= 0 {
		st.fb.duration.observe(ms)
	}
	if ttfb >= 0 {
		st.fb.ttfb.observe(ttfb)
	}
	st.stall.onFeedback(ms, ttfb, now)
}

// writeEndpointFeedbackMetrics renders the per-endpoint feedback metrics.
func (s *Server) writeEndpointFeedbackMetrics(b *strings.Builder) {
	snap := s.snap.Load()
	help := func(name, typ, text string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, typ)
	}
	help("turnout_endpoint_decisions_expired_total", "counter", "Decisions closed without a completion (decision_ttl or slot reuse): lost feedback.")
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			fmt.Fprintf(b, "turnout_endpoint_decisions_expired_total{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, e.Name, e.st.expired.Load())
		}
	}
	help("turnout_endpoint_responses_total", "counter", "Responses per endpoint by status class, from completion feedback (other: no response).")
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			for c, name := range statusClasses {
				fmt.Fprintf(b, "turnout_endpoint_responses_total{deployment=%q,pool=%q,endpoint=%q,class=%q} %d\n", p.Deployment, p.Name, e.Name, name, e.st.fb.classes[c].Load())
			}
		}
	}
	for _, h := range []struct {
		name, text string
		get        func(*endpointState) *msHistogram
	}{
		{"turnout_endpoint_request_duration_seconds", "Request duration per endpoint as the proxy saw it (feedback ms=).", func(st *endpointState) *msHistogram { return &st.fb.duration }},
		{"turnout_endpoint_ttfb_seconds", "Time to the replica's response headers per endpoint (feedback ttfb=).", func(st *endpointState) *msHistogram { return &st.fb.ttfb }},
	} {
		help(h.name, "histogram", h.text)
		for _, p := range snap.Pools() {
			for _, e := range p.Endpoints {
				hist := h.get(e.st)
				labels := fmt.Sprintf("deployment=%q,pool=%q,endpoint=%q", p.Deployment, p.Name, e.Name)
				var cum uint64
				for i, ub := range requestBuckets {
					cum += hist.counts[i].Load()
					fmt.Fprintf(b, "%s_bucket{%s,le=%q} %d\n", h.name, labels, strconv.FormatFloat(ub, 'g', -1, 64), cum)
				}
				cum += hist.counts[len(requestBuckets)].Load()
				fmt.Fprintf(b, "%s_bucket{%s,le=\"+Inf\"} %d\n", h.name, labels, cum)
				fmt.Fprintf(b, "%s_sum{%s} %g\n", h.name, labels, float64(hist.sumMs.Load())/1e3)
				fmt.Fprintf(b, "%s_count{%s} %d\n", h.name, labels, cum)
			}
		}
	}
}
