package route

import (
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/flow"
	"github.com/turnout/turnout/route/internal/routetest"
)

// sloYAML: predicted-ttft with a prior of 300 ms per request (nothing
// learned in these tests), classes with a 100 ms objective, flow control
// that never holds (max_load far above the test's load).
const sloYAML = `
health: {disable: true}
deployments:
  - name: d
    models: [m, llama]
    policy: {name: predicted-ttft, params: {block_bytes: 64, overhead_ms: 300}}
    flow_control:
      trust: {priority_header: true, slo_header: %s}
      saturation: {max_load: 1000}
      classes:
        - {name: critical, ttft_slo: 100ms}
        - {name: standard}
        - {name: sheddable, shed: true, ttft_slo: 100ms}
    pools:
      - endpoints:
          - {name: a, address: 127.0.0.1:1}
          - {name: b, address: 127.0.0.1:2}
`

func sloServer(t *testing.T, trustSLO bool) *Decider {
	t.Helper()
	trust := "false"
	if trustSLO {
		trust = "true"
	}
	s := mustServer(t, strings.Replace(sloYAML, "%s", trust, 1))
	t.Cleanup(s.Close)
	return s
}

// A sheddable request predicted to miss its class's objective on every
// replica is refused with 429 and Retry-After; a critical one with the
// same prediction is routed; a trusted header's looser objective routes
// the sheddable one, an untrusted header is not read.
func TestSLOShedsSheddablePredictedToMiss(t *testing.T) {
	s := sloServer(t, true)
	body := `{"model":"m","prompt":"hello"}`
	ctx := do(s, body, "X-Priority", "sheddable")
	if c := ctx.Response.StatusCode(); c != 429 {
		t.Fatalf("sheddable predicted at 300 ms against 100 ms: status %d, want 429: %s", c, ctx.Response.Body())
	}
	if string(ctx.Response.Header.Peek(contract.HdrRetryAfter)) == "" || string(ctx.Response.Header.Peek(contract.HdrReason)) != contract.ReasonSLOShed {
		t.Fatalf("429 without Retry-After or reason: %s", ctx.Response.Header.String())
	}
	if e := routetest.ErrBody(t, ctx.Response.Body()); e.Code != contract.ReasonSLOShed || e.Type != "rate_limit_exceeded" {
		t.Fatalf("error body %+v", e)
	}
	if c := do(s, body, "X-Priority", "critical").Response.StatusCode(); c != 200 {
		t.Fatalf("critical predicted to miss: status %d, want 200 (never shed)", c)
	}
	if c := do(s, body, "X-Priority", "sheddable", "X-Slo-Ttft-Ms", "2000").Response.StatusCode(); c != 200 {
		t.Fatalf("sheddable with a trusted 2000 ms objective: status %d, want 200", c)
	}
	if c := do(s, body, "X-Priority", "standard").Response.StatusCode(); c != 200 {
		t.Fatalf("standard without objective: status %d", c)
	}
	c := s.Snapshot().Deployments[0].flow
	if n := c.SLOCount("sheddable", flow.SLOShed); n != 1 {
		t.Fatalf("%d sheddable shed counted, want 1", n)
	}

	u := sloServer(t, false)
	if c := do(u, body, "X-Priority", "sheddable", "X-Slo-Ttft-Ms", "2000").Response.StatusCode(); c != 429 {
		t.Fatalf("untrusted SLO header read: status %d, want 429 by the class's 100 ms", c)
	}
	if strip := contract.ClientStrip(u.Snapshot().Config).Names; !strings.Contains(strings.Join(strip, ","), "x-slo-ttft-ms") {
		t.Fatalf("the glue strips %v: want the untrusted x-slo-ttft-ms", strip)
	}
	var fwd []string
	for _, h := range contract.ForwardedHeaders(s.Snapshot().Config) {
		fwd = append(fwd, h.Name)
	}
	if !strings.Contains(strings.Join(fwd, ","), "x-slo-ttft-ms") {
		t.Fatalf("forwarded %v: want the trusted x-slo-ttft-ms", fwd)
	}
}

// Routed requests with an objective count met or missed by the
// feedback's first-token time (else the response's end); the metric and
// the readiness line say so per class.
func TestSLOMetOrMissedByFeedback(t *testing.T) {
	s := sloServer(t, true)
	body := `{"model":"m","prompt":"hello"}`
	open := func(hdrs ...string) uint64 {
		t.Helper()
		ctx := do(s, body, hdrs...)
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		id, ok := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		if !ok {
			t.Fatal("no decision id")
		}
		return id
	}
	closeWith := func(id uint64, tft, ms int64) {
		t.Helper()
		c := Completion{Status: 200, Ms: ms, TTFB: 1, Retries: 0}
		if tft >= 0 {
			c.FirstTokenMs, c.HasFirstToken = tft, true
		}
		if s.Ledger().CloseDecisionWith(id, c) == nil {
			t.Fatalf("decision %x not open", id)
		}
	}
	closeWith(open("X-Priority", "critical"), 80, 5000)                        // met by tft, long stream
	closeWith(open("X-Priority", "critical"), 150, 160)                        // missed
	closeWith(open("X-Priority", "critical"), -1, 90)                          // no tft: met by its end
	closeWith(open("X-Priority", "critical", "X-Slo-Ttft-Ms", "500"), 300, -1) // the header's objective
	closeWith(open("X-Priority", "standard"), 5000, 6000)                      // no objective: not counted
	do(s, body, "X-Priority", "sheddable")                                     // shed
	var b strings.Builder
	s.WriteMetrics(&b)
	for _, want := range []string{
		`turnout_slo_requests_total{deployment="d",class="critical",outcome="met"} 3`,
		`turnout_slo_requests_total{deployment="d",class="critical",outcome="missed"} 1`,
		`turnout_slo_requests_total{deployment="d",class="standard",outcome="met"} 0`,
		`turnout_slo_requests_total{deployment="d",class="standard",outcome="missed"} 0`,
		`turnout_slo_requests_total{deployment="d",class="sheddable",outcome="shed"} 1`,
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Fatalf("metrics lack %s:\n%s", want, grepLines(b.String(), "turnout_slo"))
		}
	}
	var rb strings.Builder
	s.Extras().WriteReadinessNotes(&rb)
	if want := "slo d: critical 75.0% met (3/4, 0 shed), sheddable 0.0% met (0/0, 1 shed)\n"; !strings.Contains(rb.String(), want) {
		t.Fatalf("readiness notes lack %q:\n%s", want, rb.String())
	}
}

// A decision with an objective allocates nothing.
func TestSLODecisionAllocs(t *testing.T) {
	s := sloServer(t, true)
	ctx := routeCtx(body4K(1), "user-1")
	ctx.Request.Header.Set("X-Priority", "sheddable")
	ctx.Request.Header.Set("X-Slo-Ttft-Ms", "5000")
	assertZeroAllocs(t, s, ctx)
	if n := s.Snapshot().Deployments[0].flow.SLOCount("sheddable", flow.SLOMet); n == 0 {
		t.Fatal("the decisions were not counted against their objective")
	}
}
