package feedback

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

func metricsText(s *testServer) string {
	var b strings.Builder
	s.WriteMetrics(&b)
	return b.String()
}

func wantMetric(t *testing.T, text, line string) {
	t.Helper()
	if !strings.Contains(text, line+"\n") {
		t.Errorf("metrics lack %q", line)
	}
}

// Issue 15 item 7 / issue 12: per-endpoint in-flight, expiries, status
// classes and durations from the feedback line.
func TestEndpointFeedbackMetrics(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", ""))
	ids := openIDs(t, s, 6)
	lines := []string{
		"turnout-done id=%s srv=a status=200 ms=40 ttfb=5 tft=30",
		"turnout-done id=%s srv=a status=503 ms=3000 ttfb=2900 tft=-",
		"turnout-done id=%s srv=b status=404 ms=1 ttfb=1",
		"turnout-done id=%s srv=<NOSRV> status=413 ms=0 ttfb=-1", // no replica: no endpoint figures
	}
	for i, l := range lines {
		s.Line([]byte(fmt.Sprintf(l, ids[i])))
	}
	s.Ticker().Sweep(context.Background(), time.Now().Add(time.Hour)) // ids[4], ids[5] never complete (decision_ttl)
	m := metricsText(s)
	lab := func(ep string) string { return `deployment="llama",pool="llama_mixed",endpoint="` + ep + `"` }
	wantMetric(t, m, `turnout_endpoint_responses_total{`+lab("a")+`,class="2xx"} 1`)
	wantMetric(t, m, `turnout_endpoint_responses_total{`+lab("a")+`,class="5xx"} 1`)
	wantMetric(t, m, `turnout_endpoint_responses_total{`+lab("b")+`,class="4xx"} 1`)
	wantMetric(t, m, `turnout_endpoint_responses_total{`+lab("b")+`,class="2xx"} 0`)
	wantMetric(t, m, `turnout_endpoint_request_duration_seconds_bucket{`+lab("a")+`,le="0.05"} 1`)
	wantMetric(t, m, `turnout_endpoint_request_duration_seconds_bucket{`+lab("a")+`,le="5"} 2`)
	wantMetric(t, m, `turnout_endpoint_request_duration_seconds_sum{`+lab("a")+`} 3.04`)
	wantMetric(t, m, `turnout_endpoint_request_duration_seconds_count{`+lab("b")+`} 1`)
	wantMetric(t, m, `turnout_endpoint_ttfb_seconds_bucket{`+lab("a")+`,le="0.025"} 1`)
	// tft= only where the line has it: the header time is not taken for it.
	wantMetric(t, m, `turnout_endpoint_first_token_seconds_bucket{`+lab("a")+`,le="0.025"} 0`)
	wantMetric(t, m, `turnout_endpoint_first_token_seconds_bucket{`+lab("a")+`,le="0.05"} 1`)
	wantMetric(t, m, `turnout_endpoint_first_token_seconds_count{`+lab("a")+`} 1`)
	wantMetric(t, m, `turnout_endpoint_first_token_seconds_sum{`+lab("a")+`} 0.03`)
	wantMetric(t, m, `turnout_endpoint_first_token_seconds_count{`+lab("b")+`} 0`)
	wantMetric(t, m, `turnout_endpoint_inflight{`+lab("a")+`} 0`)
	wantMetric(t, m, `turnout_endpoint_inflight{`+lab("b")+`} 0`)
	var exp int
	for _, ep := range []string{"a", "b"} {
		for _, n := range []int{0, 1, 2, 3} {
			if strings.Contains(m, fmt.Sprintf("turnout_endpoint_decisions_expired_total{%s} %d\n", lab(ep), n)) {
				exp += n
			}
		}
	}
	if exp != 2 {
		t.Errorf("expired without completion: %d over endpoints, want 2\n%s", exp, m)
	}
	// In-flight is exposed while decisions are open.
	openIDs(t, s, 4)
	m = metricsText(s)
	if !strings.Contains(m, `turnout_endpoint_inflight{`+lab("a")+`} 2`) || !strings.Contains(m, `turnout_endpoint_inflight{`+lab("b")+`} 2`) {
		t.Errorf("inflight 2+2 not exposed")
	}
}

// The feedback path stays allocation-free, metrics and all.
func TestFeedbackAllocs(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", "s3cret-token-0123456789"))
	dgram := []byte("<134>Nov 21 10:00:00 haproxy[1]: turnout-done id=0123456789abcdef srv=b status=200 ms=1234 ttfb=12 tok=s3cret-token-0123456789 be=x tw=0\n")
	src := netip.MustParseAddr("127.0.0.1")
	if n := testing.AllocsPerRun(500, func() { s.Datagram(src, dgram) }); n != 0 {
		t.Fatalf("%v allocations per feedback datagram", n)
	}
	// A closing line too: route, then complete through the feedback path.
	ctx := routeCtx(body4K(1), "")
	line := make([]byte, 0, 128)
	n := testing.AllocsPerRun(200, func() {
		ctx.Response.Reset()
		s.api.Handler(ctx)
		line = append(line[:0], "turnout-done id="...)
		line = append(line, ctx.Response.Header.Peek(contract.HdrDecision)...)
		line = append(line, " srv=a status=200 ms=5 ttfb=1 tft=3 tok=s3cret-token-0123456789"...)
		if !s.Line(line) {
			t.Fatal("not closed")
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per decision + completion", n)
	}
}

// verbose is /readyz?verbose as route/httpapi answers it.
func verbose(s *testServer) (int, string) {
	var b strings.Builder
	ok := s.WriteReadiness(&b, true)
	s.Extras().WriteReadinessNotes(&b)
	return readyStatus(ok), b.String()
}

func readyStatus(ok bool) int {
	if ok {
		return 200
	}
	return 503
}

// Finding 5: decisions made, no completion for stalled_after: a warning, a
// gauge and a /readyz?verbose line (the status itself is unchanged).
func TestFeedbackStalledNoticed(t *testing.T) {
	var logs bytes.Buffer
	l := zerolog.New(&logs)
	cfg := mustConfig(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", "")+"\n")
	cfg.Feedback.StalledAfter = config.Duration(30 * time.Second)
	cfg.Feedback.StalledMinDecisions = 10
	s, err := newServer(t, cfg, route.Options{Log: &l})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	s.checkFeedback(cfg, t0)
	ids := openIDs(t, s, 12)
	s.Line([]byte("turnout-done id=" + ids[0] + " srv=a status=200 ms=1"))
	s.checkFeedback(cfg, t0.Add(time.Second))
	if _, body := verbose(s); !strings.Contains(body, "feedback: ok") {
		t.Fatalf("verbose with arriving feedback:\n%s", body)
	}
	// Only 11 decisions left open but nothing arrives any more.
	openIDs(t, s, 10)
	s.checkFeedback(cfg, t0.Add(20*time.Second))
	if s.Stalled() {
		t.Fatal("stalled before stalled_after")
	}
	s.checkFeedback(cfg, t0.Add(40*time.Second))
	if !s.Stalled() {
		t.Fatal("not stalled after 39s without completions and 10 decisions")
	}
	status, body := verbose(s)
	if status != 200 || !strings.Contains(body, "feedback: STALLED") || !strings.Contains(body, "10 decisions") {
		t.Fatalf("readyz?verbose %d:\n%s", status, body)
	}
	if _, plain := verbose2(s); strings.Contains(plain, "feedback") {
		t.Fatalf("plain /readyz grew a feedback line: %q", plain)
	}
	wantMetric(t, metricsText(s), "turnout_feedback_stalled 1")
	if n := strings.Count(logs.String(), "completion feedback stopped"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
	s.checkFeedback(cfg, t0.Add(50*time.Second))
	if n := strings.Count(logs.String(), "completion feedback stopped"); n != 1 {
		t.Fatalf("warning not rate-limited: %d", n)
	}
	s.Line([]byte("turnout-done id=" + ids[1] + " srv=a status=200 ms=1"))
	s.checkFeedback(cfg, t0.Add(51*time.Second))
	if s.Stalled() || !strings.Contains(logs.String(), "arriving again") {
		t.Fatal("not recovered after a completion")
	}
	wantMetric(t, metricsText(s), "turnout_feedback_stalled 0")
}

// verbose2 is plain /readyz as route/httpapi answers it.
func verbose2(s *testServer) (int, string) {
	var b strings.Builder
	ok := s.WriteReadiness(&b, false)
	return readyStatus(ok), b.String()
}

// With feedback.disable nothing "stops": feedback is off.
func TestFeedbackOffIsNotStalled(t *testing.T) {
	s := mustServer(t, "feedback: {disable: true}\n"+fmt.Sprintf(fourEndpoints, "least-request"))
	cfg := s.Snapshot().Config
	t0 := time.Now()
	s.checkFeedback(cfg, t0)
	openIDs(t, s, 50)
	s.checkFeedback(cfg, t0.Add(time.Hour))
	if s.Stalled() {
		t.Fatal("feedback off reported as stalled")
	}
	if _, body := verbose(s); !strings.Contains(body, "feedback: off") {
		t.Fatalf("verbose:\n%s", body)
	}
}

// replica is an httptest replica whose answers can be held.
type replica struct {
	*httptest.Server
	stall atomic.Int64 // ns
	hits  atomic.Int64
}

func newReplica(t *testing.T) *replica {
	r := &replica{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		_, _ = io.Copy(io.Discard, req.Body) // so a gone client cancels req.Context()
		if d := time.Duration(r.stall.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-req.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"text":"x"}]}`))
	}))
	t.Cleanup(r.Close)
	t.Cleanup(func() { r.stall.Store(0) })
	return r
}

// syncBuffer is a log sink safe for the probes' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func stallServer(t *testing.T, reps ...*replica) (*testServer, *syncBuffer) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "health: {disable: true, stall: {budget: 300ms, readmit: 300ms}}\nfeedback: {syslog: 127.0.0.1:5140}\ndeployments:\n  - name: llama\n    pools:\n      - role: mixed\n        endpoints:\n")
	for i, r := range reps {
		fmt.Fprintf(&b, "          - {name: r%d, address: %q}\n", i, strings.TrimPrefix(r.URL, "http://"))
	}
	logs := &syncBuffer{}
	l := zerolog.New(logs)
	s, err := newServer(t, mustConfig(t, b.String()), route.Options{Log: &l})
	if err != nil {
		t.Fatal(err)
	}
	return s, logs
}

func endpointByName(s *testServer, name string) *fleet.Endpoint {
	return s.Snapshot().EndpointByServer([]byte(name))
}

// tickUntil runs the periodic work until cond holds.
func tickUntil(t *testing.T, s *testServer, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		s.Ticker().Sweep(context.Background(), time.Now()) // one tick of Run: the sweep, then the feedback checks
		time.Sleep(20 * time.Millisecond)
	}
}

// Finding 9: a slow first byte in the feedback makes the endpoint suspect;
// a probe that also misses the budget degrades it (no more decisions); a
// probe answered in time brings it back.
func TestStallDegradesFromFeedback(t *testing.T) {
	r0, r1 := newReplica(t), newReplica(t)
	s, logs := stallServer(t, r0, r1)
	r0.stall.Store(int64(10 * time.Second))
	s.Line([]byte("turnout-done id=- srv=r0 status=200 ms=30000 ttfb=29990"))
	tickUntil(t, s, "r0 degraded", func() bool { return endpointByName(s, "r0").Degraded() })
	for i := 0; i < 20; i++ {
		if got := hdr(do(s, chatBody("llama", "", "x")), contract.HdrServer); got != "r1" {
			t.Fatalf("decision went to %s while r0 is degraded", got)
		}
	}
	if _, body := verbose(s); !strings.Contains(body, "endpoint r0 (pool llama_mixed): degraded") {
		t.Fatalf("verbose:\n%s", body)
	}
	wantMetric(t, metricsText(s), `turnout_endpoint_degraded{deployment="llama",pool="llama_mixed",endpoint="r0"} 1`)
	r0.stall.Store(0)
	tickUntil(t, s, "r0 readmitted and logged", func() bool {
		return !endpointByName(s, "r0").Degraded() && strings.Contains(logs.String(), "endpoint recovered")
	})
}

// Finding 9 without any feedback from the stalled replica: its decisions
// stay open past half the budget while completions arrive from the others.
func TestStallDegradesFromOpenDecisions(t *testing.T) {
	r0, r1 := newReplica(t), newReplica(t)
	s, _ := stallServer(t, r0, r1)
	r0.stall.Store(int64(10 * time.Second))
	// Completions arrive (r1 answers), so open decisions mean something.
	var onR0 bool
	for i := 0; i < 40 && (!onR0 || completed(s) == 0); i++ {
		ctx := do(s, chatBody("llama", "", "x"))
		if hdr(ctx, contract.HdrServer) == "r0" {
			onR0 = true
			continue
		}
		s.Line([]byte("turnout-done id=" + hdr(ctx, contract.HdrDecision) + " srv=r1 status=200 ms=5 ttfb=2"))
	}
	if !onR0 {
		t.Fatal("no decision for r0")
	}
	start := time.Now()
	tickUntil(t, s, "r0 degraded", func() bool { return endpointByName(s, "r0").Degraded() })
	t.Logf("degraded %v after the decision opened (budget 300ms)", time.Since(start))
	if endpointByName(s, "r1").Degraded() {
		t.Fatal("healthy r1 degraded")
	}
}

// A long stream is not a stall: its decision stays open, but the probe
// answers in time, and the endpoint keeps its decisions.
func TestLongStreamNotDegraded(t *testing.T) {
	r0, r1 := newReplica(t), newReplica(t)
	s, _ := stallServer(t, r0, r1)
	s.Line([]byte("turnout-done id=- srv=r1 status=200 ms=5 ttfb=2"))
	for i := 0; i < 10; i++ {
		do(s, chatBody("llama", "", "x")) // never completed: long streams
	}
	// Completions "arrive": one decision closes, its figures go to r1.
	s.Line([]byte("turnout-done id=" + hdr(do(s, chatBody("llama", "", "x")), contract.HdrDecision) + " srv=r1 status=200 ms=5 ttfb=2"))
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		s.Ticker().Sweep(context.Background(), time.Now()) // one tick of Run: the sweep, then the feedback checks
		time.Sleep(20 * time.Millisecond)
	}
	if endpointByName(s, "r0").Degraded() || endpointByName(s, "r1").Degraded() {
		t.Fatal("a long stream degraded its endpoint")
	}
	if r0.hits.Load() == 0 || r0.hits.Load() > 3 {
		t.Fatalf("r0 probed %d times in 1.5s, want 1..3 (one probe clears the suspicion)", r0.hits.Load())
	}
}

// The last available endpoint of a pool stays, stalled or not.
func TestStallKeepsLastEndpoint(t *testing.T) {
	r0, r1 := newReplica(t), newReplica(t)
	s, logs := stallServer(t, r0, r1)
	endpointByName(s, "r1").SetDown(true)
	r0.stall.Store(int64(10 * time.Second))
	s.Line([]byte("turnout-done id=- srv=r0 status=200 ms=30000 ttfb=29990"))
	tickUntil(t, s, "the stalled probe to be logged", func() bool { return strings.Contains(logs.String(), "last available") })
	if endpointByName(s, "r0").Degraded() {
		t.Fatal("the last available endpoint was degraded")
	}
}

func TestStallBudgetPerPool(t *testing.T) {
	c := mustConfig(t, `
deployments:
  - name: pd
    pools:
      - {role: prefill, endpoints: [{name: p, address: 127.0.0.1:1}]}
      - {role: decode, endpoints: [{name: d, address: 127.0.0.1:2}]}
  - name: m
    pools:
      - {role: mixed, stall_budget: 5s, endpoints: [{name: x, address: 127.0.0.1:3}]}
`)
	pools := []*config.PoolConfig{&c.Deployments[0].Pools[0], &c.Deployments[0].Pools[1], &c.Deployments[1].Pools[0]}
	for i, want := range []time.Duration{0, 30 * time.Second, 5 * time.Second} {
		if got := c.StallBudget(pools[i]); got != want {
			t.Errorf("pool %s: budget %v, want %v", pools[i].Role, got, want)
		}
	}
	c.Health.Stall.Disable = true
	if c.StallBudget(pools[2]) != 0 {
		t.Error("disable ignored")
	}
}

// completed is how many decisions were completed.
func completed(s *testServer) uint64 {
	_, done, _ := s.Ledger().Counts()
	return done
}
