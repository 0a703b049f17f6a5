//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/testenv/otlptest"
	"github.com/turnout/turnout/route/tracing"
)

// The client's W3C trace context in the tracing tests: a known trace id
// and parent span id, sampled.
const (
	e2eTraceID    = "0af7651916cd43dd8448eb211c80319c"
	e2eParentSpan = "b7ad6b7169203331"
	e2eTraceState = "congo=t61rcWkgMzE"
)

var e2eTraceparent = "00-" + e2eTraceID + "-" + e2eParentSpan + "-01"

// checkDecisionSpan checks the span the receiver got for the client's
// trace: turnout's decision, a child of the client's span, with its
// attributes naming the replica that served.
func checkDecisionSpan(t *testing.T, rcv *otlptest.Receiver, served string) {
	t.Helper()
	s := rcv.WaitSpan(t, e2eTraceID, 60*time.Second)
	if s.Name != tracing.SpanName || s.ParentSpanID != e2eParentSpan || s.TraceState != e2eTraceState || s.Service != "turnout" {
		t.Errorf("span %q parent %s state %q service %q", s.Name, s.ParentSpanID, s.TraceState, s.Service)
	}
	for k, want := range map[string]any{
		tracing.AttrDeployment: "llama", tracing.AttrPool: "llama_mixed", tracing.AttrPolicy: "round-robin",
		tracing.AttrOutcome: "balanced", tracing.AttrEndpoint: served, tracing.AttrStatus: int64(200), tracing.AttrModel: "llama",
	} {
		if s.Attrs[k] != want {
			t.Errorf("%s = %v, want %v (%v)", k, s.Attrs[k], want, s.Attrs)
		}
	}
	if id, _ := s.Attrs[tracing.AttrDecision].(string); len(id) != 16 {
		t.Errorf("decision id %q", id)
	}
}

// checkReplicaTraceparent checks that the replica got the client's trace
// context unchanged.
func checkReplicaTraceparent(t *testing.T, m *Mock) {
	t.Helper()
	reqs := hpdRequests(t, m)
	if len(reqs) == 0 {
		t.Fatalf("%s saw no chat request", m.Name)
	}
	h := reqs[len(reqs)-1].Headers
	if h["traceparent"] != e2eTraceparent || h["tracestate"] != e2eTraceState {
		t.Errorf("replica saw traceparent %q tracestate %q, want %q %q", h["traceparent"], h["tracestate"], e2eTraceparent, e2eTraceState)
	}
}

// TestTracingHAProxySPOE: turnout + HAProxy over the SPOE path with
// tracing to an OTLP/gRPC receiver: a client's request with a known
// traceparent yields turnout's decision span with that trace id and parent
// span id and the decision's attributes, and the replica receives the
// client's traceparent and tracestate unchanged.
func TestTracingHAProxySPOE(t *testing.T) {
	NeedHAProxy(t)
	rcv := otlptest.StartGRPC(t)
	m := StartMock(t, "good", nil)
	dir := t.TempDir()
	turnoutAddr, haAddr, syslog := FreeAddr(t), FreeAddr(t), FreeUDPAddr(t)
	cfg := fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
haproxy: {listen: %q, dir: %q, path: spoe, nbthread: 2}
tracing: {endpoint: %q, protocol: grpc, insecure: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: round-robin}
    pools:
      - role: mixed
        endpoints:
          - {name: good, address: %q}
`, turnoutAddr, syslog, haAddr, dir, rcv.Addr, m.Addr)
	StartTurnout(t, turnoutAddr, cfg, "--haproxy-dir", dir)
	h := StartRenderedHAProxy(t, dir, haAddr)
	h.WaitServersUp(t, "llama_mixed/good")
	client := &http.Client{Timeout: 10 * time.Second}
	r, err := Post(context.Background(), client, h.URL+"/v1/chat/completions", chatBody("llama", "sys", "hello", false),
		map[string]string{"Content-Type": "application/json", "traceparent": e2eTraceparent, "tracestate": e2eTraceState})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != 200 {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	checkDecisionSpan(t, rcv, "good")
	checkReplicaTraceparent(t, m)
}

// TestTracingNginx: the same through nginx (body mode, njs) with tracing
// to an OTLP/HTTP receiver.
func TestTracingNginx(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	m := StartMock(t, "good", nil)
	s := (&nstack{failMode: "closed", extraYAML: fmt.Sprintf("tracing: {endpoint: %q, protocol: http, insecure: true}\n", "http://"+rcv.Addr+"/v1/traces"),
		deps: []ndep{{name: "llama", policy: "{name: round-robin}", mode: "body", mocks: []*Mock{m}}}}).start(t)
	r := s.post(t, "/v1/chat/completions", chatBody("llama", "sys", "hello", false),
		map[string]string{"traceparent": e2eTraceparent, "tracestate": e2eTraceState})
	if r.Status != 200 {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	checkDecisionSpan(t, rcv, "good")
	checkReplicaTraceparent(t, m)
}
