package route

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
)

const flowYAML = `
deployments:
  - name: d
    models: [m]
    flow_control:
      trust: {priority_header: true, tenant_header: true}
      saturation: {max_load: 1}
      classes:
        - {name: critical}
        - {name: standard, max_wait: 1m}
        - {name: sheddable, max_wait: 50ms, shed: true}
    pools:
      - endpoints:
          - {name: a, address: 127.0.0.1:1}
          - {name: b, address: 127.0.0.1:2}
`

// The decision pipeline behind flow control: with both replicas at
// max_load a request is held, and the completion of a decision releases
// it, to the replica that freed.
func TestFlowHoldsUntilCompletion(t *testing.T) {
	s := mustServer(t, flowYAML)
	defer s.Close()
	body := `{"model":"m","prompt":"x"}`
	var ids []string
	var servers []string
	for range 2 {
		ctx := do(s, body, "X-Priority", "standard")
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		ids = append(ids, string(ctx.Response.Header.Peek(contract.HdrDecision)))
		servers = append(servers, string(ctx.Response.Header.Peek(contract.HdrServer)))
	}
	held := make(chan *fasthttp.RequestCtx, 1)
	go func() { held <- do(s, body, "x_priority", "STANDARD") }()
	select {
	case ctx := <-held:
		t.Fatalf("decided (%d) while both replicas are at max_load", ctx.Response.StatusCode())
	case <-time.After(50 * time.Millisecond):
	}
	var rb strings.Builder
	s.Extras().WriteReadinessNotes(&rb)
	if !strings.Contains(rb.String(), "flow d: 1 held (critical 0, standard 1, sheddable 0), saturated\n") {
		t.Fatalf("readiness notes lack the held request:\n%s", rb.String())
	}
	id, ok := contract.ParseDecisionID([]byte(ids[1]))
	if !ok || !s.Ledger().Complete(id) {
		t.Fatalf("cannot complete %s", ids[1])
	}
	select {
	case ctx := <-held:
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("released request: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		if got := string(ctx.Response.Header.Peek(contract.HdrServer)); got != servers[1] {
			t.Fatalf("released to %s, want %s, the replica that freed", got, servers[1])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a completion did not release the held request")
	}
	var b strings.Builder
	s.WriteMetrics(&b)
	if !strings.Contains(b.String(), `turnout_flow_requests_total{deployment="d",class="standard",tenant="none",outcome="released"} 1`) {
		t.Fatalf("metrics lack the release:\n%s", grepLines(b.String(), "turnout_flow_requests_total"))
	}
}

func TestFlowShedsWith429(t *testing.T) {
	s := mustServer(t, flowYAML)
	defer s.Close()
	body := `{"model":"m","prompt":"x"}`
	for range 2 {
		if c := do(s, body).Response.StatusCode(); c != 200 {
			t.Fatalf("status %d", c)
		}
	}
	ctx := do(s, body, "X-Priority", "sheddable")
	if c := ctx.Response.StatusCode(); c != 429 {
		t.Fatalf("sheddable past budget: %d, want 429", c)
	}
	if string(ctx.Response.Header.Peek(contract.HdrRetryAfter)) == "" || string(ctx.Response.Header.Peek(contract.HdrReason)) != contract.ReasonFlowShed {
		t.Fatalf("429 without Retry-After or reason: %s", ctx.Response.Header.String())
	}
	if e := routetest.ErrBody(t, ctx.Response.Body()); e.Code != contract.ReasonFlowShed || e.Type != "rate_limit_exceeded" {
		t.Fatalf("error body %+v", e)
	}
	if contract.GlueActionFor(429, []byte(contract.ReasonFlowShed)) != contract.GlueRelay || contract.RelayStatus(429) != 429 {
		t.Fatal("the glue must relay the 429 as it is")
	}
}

// The flow headers travel from every glue: they are forwarded headers.
func TestFlowHeadersForwarded(t *testing.T) {
	cfg := mustConfig(t, flowYAML)
	var names []string
	for _, h := range contract.ForwardedHeaders(cfg) {
		names = append(names, h.Name)
	}
	got := strings.Join(names, ",")
	if !strings.Contains(got, "x-priority") || !strings.Contains(got, "x-tenant-id") || strings.Contains(got, "authorization") {
		t.Fatalf("forwarded %s: want x-priority and x-tenant-id, no authorization", got)
	}
	if d := cfg.RouteCallTimeout(); d < time.Minute {
		t.Fatalf("route call timeout %v: must outlast the 1m max_wait", d)
	}
	// Untrusted, they are stripped by the glue and not forwarded: a
	// client's own x-priority never reaches the decision.
	cfg = mustConfig(t, strings.Replace(flowYAML, "      trust: {priority_header: true, tenant_header: true}\n", "", 1))
	names = names[:0]
	for _, h := range contract.ForwardedHeaders(cfg) {
		names = append(names, h.Name)
	}
	if got := strings.Join(names, ","); strings.Contains(got, "x-priority") || strings.Contains(got, "x-tenant-id") {
		t.Fatalf("forwarded %s without trust", got)
	}
	strip := contract.ClientStrip(cfg).Names
	if !slices.Contains(strip, "x-priority") || !slices.Contains(strip, "x-tenant-id") {
		t.Fatalf("the glue strips %v: want the untrusted x-priority and x-tenant-id", strip)
	}
}

// A reload that keeps the flow config keeps the controller and what it
// holds; one that removes flow control releases it.
func TestFlowReload(t *testing.T) {
	s := mustServer(t, flowYAML)
	defer s.Close()
	body := `{"model":"m","prompt":"x"}`
	for range 2 {
		do(s, body)
	}
	held := make(chan int, 1)
	go func() { held <- do(s, body).Response.StatusCode() }()
	c := s.Snapshot().Deployments[0].flow
	for c.Queued() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := s.Apply(mustConfig(t, flowYAML)); err != nil {
		t.Fatal(err)
	}
	if s.Snapshot().Deployments[0].flow != c || c.Queued() != 1 {
		t.Fatal("an unchanged flow config must keep its controller and queue")
	}
	if err := s.Apply(mustConfig(t, strings.Replace(flowYAML, "    flow_control:\n      trust: {priority_header: true, tenant_header: true}\n      saturation: {max_load: 1}\n      classes:\n        - {name: critical}\n        - {name: standard, max_wait: 1m}\n        - {name: sheddable, max_wait: 50ms, shed: true}\n", "", 1))); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-held:
		if code != 200 {
			t.Fatalf("released by the reload: %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("removing flow control did not release the held request")
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
