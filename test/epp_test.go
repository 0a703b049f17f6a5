//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/turnout/turnout/lab/bench"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/epp"
)

// The Endpoint Picker end to end: `turnout serve` with epp.listen, mock
// replicas serving SSE streams, and the gateways of epp_gateway_test.go
// asking it. Each test is named after the protocol rule it checks (GIE
// docs/proposals/004-endpoint-picker-protocol).

// eppStack is a turnout serving the Endpoint Picker in front of replicas.
type eppStack struct {
	tu               *Turnout
	eppAddr, healthA string
	reqLog           string
	// names maps a replica's ip:port to its name, in the config and as
	// the mock's X-Replica.
	names map[string]string
	gw    *envoyGateway
}

// eppSpec is what a stack's config varies in.
type eppSpec struct {
	policy string // default round-robin
	mocks  []*Mock
	// down are replicas' addresses nothing listens on yet (named down-N).
	down   []string
	health string // the health: section's value; default {disable: true}
	extra  string // more of the deployment (indented 4)
	top    string // more top-level config
	epp    string // more of the epp: section (flow-mapping entries)
}

func startEPPStack(t *testing.T, sp eppSpec) *eppStack {
	t.Helper()
	if sp.policy == "" {
		sp.policy = "{name: round-robin}"
	}
	if sp.health == "" {
		sp.health = "{disable: true}"
	}
	s := &eppStack{eppAddr: FreeAddr(t), healthA: FreeAddr(t), names: map[string]string{},
		reqLog: filepath.Join(t.TempDir(), "requests.log")}
	listen := FreeAddr(t)
	var eps strings.Builder
	for _, m := range sp.mocks {
		s.names[m.Addr] = m.Name
	}
	for i, a := range sp.down {
		s.names[a] = fmt.Sprintf("down-%d", i)
	}
	for _, a := range slices.Sorted(maps.Keys(s.names)) {
		fmt.Fprintf(&eps, "          - {name: %s, address: %q}\n", s.names[a], a)
	}
	cfg := fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
request_log: {sample: 1, to: file, file: %q}
epp: {listen: %s, health_listen: %s%s}
session_headers: [x-session-id]
fallbacks: 2
health: %s
%sdeployments:
  - name: llama
    models: [llama]
    policy: %s
%s    pools:
      - role: mixed
        endpoints:
%s`, listen, FreeUDPAddr(t), s.reqLog, s.eppAddr, s.healthA, sp.epp, sp.health, sp.top, sp.policy, sp.extra, eps.String())
	s.tu = StartTurnout(t, listen, cfg)
	hc := healthpb.NewHealthClient(eppDial(t, s.eppAddr))
	Eventually(t, 10*time.Second, "the Endpoint Picker to answer on "+s.eppAddr, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: epp.HealthLiveness})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	s.gw = newEnvoyGateway(t, s.eppAddr)
	return s
}

// eppMocks starts n replicas and returns them with their addresses, in
// the order the config lists them.
func eppMocks(t *testing.T, n int) ([]*Mock, []string) {
	ms := mocks(t, "epp", n, nil)
	slices.SortFunc(ms, func(a, b *Mock) int { return strings.Compare(a.Addr, b.Addr) })
	addrs := make([]string, n)
	for i, m := range ms {
		addrs[i] = m.Addr
	}
	return ms, addrs
}

func (s *eppStack) metric(t *testing.T, name string, filters ...string) float64 {
	t.Helper()
	v, err := Metric(t, s.tu.URL+"/metrics", name, filters...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkServed checks a routed request went where the pick said and came
// back whole through the response phase.
func (s *eppStack) checkServed(t *testing.T, r *gwResult, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("request: %v (pick %+v)", err, r)
	}
	if r.Refused != 0 {
		t.Fatalf("refused %d %s: %s", r.Refused, r.Reason, r.Body)
	}
	if r.Status != 200 || r.Served != r.Dest[0] || r.Replica != s.names[r.Served] {
		t.Fatalf("status %d served by %s (%s), pick %v", r.Status, r.Served, r.Replica, r.Dest)
	}
	if !bytes.Equal(r.Passed, r.Upstream) || !r.Events.done || r.Events.content == 0 {
		t.Fatalf("the SSE stream did not come back whole: %d of %d bytes, %+v", len(r.Passed), len(r.Upstream), r.Events)
	}
}

// waitClosed waits until no decision is open.
func (s *eppStack) waitClosed(t *testing.T) {
	t.Helper()
	Eventually(t, 15*time.Second, "turnout_endpoint_inflight back to 0", func() bool {
		v, err := Metric(t, s.tu.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	})
}

// logLine is a request log record (docs/request-log.md).
type logLine struct {
	Decision, Endpoint, ServedBy, State string
	Status                              int
}

func (l *logLine) UnmarshalJSON(b []byte) error {
	var raw struct {
		Decision string `json:"decision"`
		Endpoint string `json:"endpoint"`
		ServedBy string `json:"served_by"`
		State    string `json:"state"`
		Status   int    `json:"status"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*l = logLine{raw.Decision, raw.Endpoint, raw.ServedBy, raw.State, raw.Status}
	return nil
}

// requestLog reads the request log's records of decisions.
func (s *eppStack) requestLog(t *testing.T) []logLine {
	t.Helper()
	b, err := os.ReadFile(s.reqLog)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []logLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Decision != "" {
			out = append(out, l)
		}
	}
	return out
}

// ledger is GET /internal/decision/<id>.
func (s *eppStack) ledger(t *testing.T, id string) logLine {
	t.Helper()
	hdr := map[string]string{}
	if tok := s.tu.FeedbackToken(t); tok != "" {
		hdr[contract.HdrToken] = tok
	}
	req, _ := http.NewRequest(http.MethodGet, s.tu.URL+"/internal/decision/"+id, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var l logLine
	if err := json.NewDecoder(res.Body).Decode(&l); err != nil || res.StatusCode != 200 {
		t.Fatalf("GET /internal/decision/%s: %d %v", id, res.StatusCode, err)
	}
	return l
}

func ctx30(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The pick's header and its envoy.lb metadata carry the same value, for
// every shape of request: a small and a multi-chunk body full duplex, a
// buffered one; the body reaches the replica as the client sent it and
// the SSE stream comes back whole through the response phase.
func TestEPP_E2E_HeaderEqualsMetadata(t *testing.T) {
	ms, _ := eppMocks(t, 3)
	s := startEPPStack(t, eppSpec{mocks: ms})
	ctx := ctx30(t)
	long := chatRequest(strings.Repeat("a long prompt ", 15000)) // ~210 KB: 4 chunks
	buffered := chatRequest("buffered")
	buffered.Mode = modeBuffered
	picked := map[string]bool{}
	for i, r := range []gwRequest{chatRequest("hello"), long, buffered, chatRequest("again"), long, buffered} {
		res, err := s.gw.Do(ctx, r)
		s.checkServed(t, res, err)
		if len(res.Dest) != 3 || len(slices.Compact(slices.Sorted(slices.Values(res.Dest)))) != 3 {
			t.Fatalf("request %d: pick %v: want the primary and 2 distinct fallbacks", i, res.Dest)
		}
		if !bytes.Equal(res.Sent, r.Body) {
			t.Fatalf("request %d: the replica got %d bytes of %d", i, len(res.Sent), len(r.Body))
		}
		picked[res.Dest[0]] = true
	}
	if len(picked) != 3 {
		t.Fatalf("round-robin picked %v of 3 replicas", picked)
	}
	s.waitClosed(t)
}

// The subset hint is honoured: every endpoint of every pick (primary and
// fallbacks) is one of the hint's, and the policy spreads over them. This
// one runs on grpc-go (epp.server: grpc), the others on the default.
func TestEPP_E2E_SubsetHonoured(t *testing.T) {
	ms, addrs := eppMocks(t, 4)
	s := startEPPStack(t, eppSpec{mocks: ms, epp: ", server: grpc"})
	ctx := ctx30(t)
	subset := []string{addrs[1], addrs[3]}
	primaries := map[string]int{}
	for i := range 12 {
		r := chatRequest(fmt.Sprintf("subset %d", i))
		if i%2 == 1 {
			r.Mode = modeBuffered
		}
		r.Subset = subset
		res, err := s.gw.Do(ctx, r)
		s.checkServed(t, res, err)
		for _, d := range res.Dest {
			if !slices.Contains(subset, d) {
				t.Fatalf("pick %v leaves the subset %v", res.Dest, subset)
			}
		}
		primaries[res.Dest[0]]++
	}
	if primaries[addrs[1]] == 0 || primaries[addrs[3]] == 0 {
		t.Fatalf("primaries %v: round-robin within the subset uses both", primaries)
	}
	for _, m := range []*Mock{ms[0], ms[2]} {
		if n := m.Stats().Requests; n != 0 {
			t.Fatalf("%s outside the subset served %d requests", m.Name, n)
		}
	}
	s.waitClosed(t)
}

// A subset hint that is empty, or names no endpoint turnout routes to, is
// a 503 ImmediateResponse (turnout's JSON error), and opens no decision.
func TestEPP_E2E_EmptySubset503(t *testing.T) {
	ms, _ := eppMocks(t, 2)
	s := startEPPStack(t, eppSpec{mocks: ms})
	ctx := ctx30(t)
	for _, sub := range [][]string{{}, {"127.0.0.1:1"}} {
		for _, mode := range []bench.GatewayMode{modeFullDuplex, modeBuffered} {
			r := chatRequest("nowhere")
			r.Subset, r.Mode = sub, mode
			res, err := s.gw.Do(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			checkRefusal(t, res, 503, contract.ReasonSubsetEmpty)
		}
	}
	if v := s.metric(t, "turnout_endpoint_inflight"); v != 0 {
		t.Fatalf("%v decisions opened by refused requests", v)
	}
	if n := ms[0].Stats().Requests + ms[1].Stats().Requests; n != 0 {
		t.Fatalf("the replicas got %d requests", n)
	}
}

// checkRefusal checks an ImmediateResponse: its status, reason, and an
// OpenAI-style error body with the same code.
func checkRefusal(t *testing.T, r *gwResult, status int, reason string) {
	t.Helper()
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if r.Refused != status || r.Reason != reason || json.Unmarshal(r.Body, &e) != nil || e.Error.Code != reason {
		t.Fatalf("want %d %s, got %d %q, body %s (pick %v)", status, reason, r.Refused, r.Reason, r.Body, r.Dest)
	}
}

// Flow control sheds a sheddable request when the pool is saturated: a
// 429 ImmediateResponse with Retry-After; once the pool has room the same
// request is routed.
func TestEPP_E2E_Shed429(t *testing.T) {
	ms, _ := eppMocks(t, 1)
	s := startEPPStack(t, eppSpec{mocks: ms, extra: `    flow_control:
      saturation: {max_load: 1}
      classes:
        - {name: critical}
        - {name: standard, max_wait: 10s}
        - {name: sheddable, max_wait: 50ms, shed: true}
`})
	ctx := ctx30(t)
	first, err := s.gw.Pick(ctx, chatRequest("first"))
	if err != nil || first.Pick.Refused != 0 {
		t.Fatalf("first: %v %+v", err, first)
	}
	shed := chatRequest("shed me", "x-priority", "sheddable")
	res, err := s.gw.Do(ctx, shed)
	if err != nil {
		t.Fatal(err)
	}
	checkRefusal(t, res, 429, contract.ReasonFlowShed)
	if res.RetryAfter == "" {
		t.Fatal("a shed request without Retry-After")
	}
	// The first request's response closes its decision: room again.
	done, err := withEvents(first.Finish())
	s.checkServed(t, done, err)
	s.waitClosed(t)
	res, err = s.gw.Do(ctx, shed)
	s.checkServed(t, res, err)
	s.waitClosed(t)
}

// Fallbacks come in turnout's order (the same list /internal/route
// answers for the request, primary first), and the gateway going down
// the list is recorded: the decision is closed with the fallback that
// served it.
func TestEPP_E2E_FallbacksInOrder(t *testing.T) {
	ms, _ := eppMocks(t, 4)
	s := startEPPStack(t, eppSpec{mocks: ms, policy: "{name: session-hash}"})
	ctx := ctx30(t)
	req := chatRequest("sticky", "x-session-id", "s-42")
	// What the HTTP transport answers for the same request.
	hr, err := Post(ctx, http.DefaultClient, s.tu.URL+"/internal/route", req.Body, map[string]string{"X-Session-Id": "s-42"})
	if err != nil || hr.Status != 200 {
		t.Fatalf("/internal/route: %v %+v", err, hr)
	}
	byName := map[string]string{}
	for a, n := range s.names {
		byName[n] = a
	}
	want := []string{byName[hr.Header.Get(contract.HdrServer)]}
	for n := range strings.SplitSeq(hr.Header.Get(contract.HdrFallbacks), ",") {
		want = append(want, byName[n])
	}
	if len(want) != 3 || slices.Contains(want, "") {
		t.Fatalf("/internal/route named %s then %s", hr.Header.Get(contract.HdrServer), hr.Header.Get(contract.HdrFallbacks))
	}
	for range 3 {
		res, err := s.gw.Do(ctx, req)
		s.checkServed(t, res, err)
		if !slices.Equal(res.Dest, want) {
			t.Fatalf("the Endpoint Picker's pick %v, /internal/route's %v", res.Dest, want)
		}
	}
	// The primary goes away unseen (no health checks): the gateway's
	// retry goes down the list, and reports the one that served.
	var primary *Mock
	for _, m := range ms {
		if m.Addr == want[0] {
			primary = m
		}
	}
	_ = primary.Close()
	res, err := s.gw.Do(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Dest, want) || res.Served != want[1] || res.Replica != s.names[want[1]] || res.Status != 200 || !res.Events.done {
		t.Fatalf("pick %v served by %s (%s) status %d; want %s", res.Dest, res.Served, res.Replica, res.Status, want[1])
	}
	var found bool
	Eventually(t, 10*time.Second, "the request log line of the retried request", func() bool {
		for _, l := range s.requestLog(t) {
			if l.Endpoint == s.names[want[0]] && l.ServedBy == s.names[want[1]] && l.State == "closed" && l.Status == 200 {
				found = s.ledger(t, l.Decision).ServedBy == s.names[want[1]]
				return true
			}
		}
		return false
	})
	if !found {
		t.Fatal("the ledger does not name the fallback that served")
	}
}

// The gRPC health services: liveness serves from the start; readiness and
// the ext_proc service are NOT_SERVING until turnout knows a replica is
// up, SERVING after; the plaintext health listener says the same.
func TestEPP_E2E_HealthServices(t *testing.T) {
	addr := FreeAddr(t) // nothing listens yet
	s := startEPPStack(t, eppSpec{down: []string{addr}, health: "{interval: 100ms, timeout: 300ms}"})
	plain, err := grpc.NewClient("passthrough:///"+s.healthA, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	clients := map[string]healthpb.HealthClient{
		"epp.listen":        healthpb.NewHealthClient(eppDial(t, s.eppAddr)),
		"epp.health_listen": healthpb.NewHealthClient(plain),
	}
	status := func(c healthpb.HealthClient, svc string) healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("Check(%s): %v", svc, err)
		}
		return r.GetStatus()
	}
	// Well past the first health rounds, with the replica still down.
	Eventually(t, 10*time.Second, "the replica to be seen down", func() bool {
		v, err := Metric(t, s.tu.URL+"/metrics", "turnout_health_checks_total")
		return err == nil && v >= 3
	})
	for where, c := range clients {
		for svc, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
			epp.HealthLiveness:  healthpb.HealthCheckResponse_SERVING,
			epp.HealthReadiness: healthpb.HealthCheckResponse_NOT_SERVING,
			epp.HealthExtProc:   healthpb.HealthCheckResponse_NOT_SERVING,
		} {
			if got := status(c, svc); got != want {
				t.Fatalf("%s %s: %v with no replica up, want %v", where, svc, got, want)
			}
		}
	}
	StartMockAt(t, s.names[addr], addr, nil)
	for where, c := range clients {
		for _, svc := range []string{epp.HealthReadiness, epp.HealthExtProc} {
			Eventually(t, 10*time.Second, where+" "+svc+" SERVING", func() bool {
				return status(c, svc) == healthpb.HealthCheckResponse_SERVING
			})
		}
	}
	res, err := s.gw.Do(ctx30(t), chatRequest("ready now"))
	s.checkServed(t, res, err)
}

// With every replica down the answer is a 503 ImmediateResponse, not a
// pick.
func TestEPP_E2E_NoEndpoint503(t *testing.T) {
	ms, _ := eppMocks(t, 2)
	s := startEPPStack(t, eppSpec{mocks: ms, health: "{interval: 100ms, timeout: 300ms}"})
	ctx := ctx30(t)
	Eventually(t, 10*time.Second, "both replicas up", func() bool {
		v, err := Metric(t, s.tu.URL+"/metrics", "turnout_endpoint_up")
		return err == nil && v == 2
	})
	res, err := s.gw.Do(ctx, chatRequest("up"))
	s.checkServed(t, res, err)
	for _, m := range ms {
		_ = m.Close()
	}
	Eventually(t, 10*time.Second, "both replicas down", func() bool {
		v, err := Metric(t, s.tu.URL+"/metrics", "turnout_endpoint_up")
		return err == nil && v == 0
	})
	for _, mode := range []bench.GatewayMode{modeFullDuplex, modeBuffered} {
		r := chatRequest("down")
		r.Mode = mode
		res, err := s.gw.Do(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		checkRefusal(t, res, 503, contract.ReasonNoEndpoint)
	}
}
