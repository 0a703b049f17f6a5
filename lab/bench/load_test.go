package bench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/lab/mock"
)

const wrkOut = `Running 3s test @ http://127.0.0.1:9099/internal/route
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   112.10us   80.22us   3.20ms   95.00%
    Req/Sec    99.30k     2.10k  101.00k    80.00%
  Latency Distribution
     50%   97.00us
     75%  120.00us
     90%  160.00us
     99%    1.50ms
  297900 requests in 3.00s, 40.01MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 10
Requests/sec:  99300.00
Transfer/sec:     13.34MB
`

func TestParseWrk(t *testing.T) {
	r, err := ParseWrk([]byte(wrkOut))
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 297890 || r.Errors != 13 || r.Elapsed != 3*time.Second {
		t.Fatalf("result %+v", r)
	}
	if r.P50 != 97*time.Microsecond || r.P99 != 1500*time.Microsecond {
		t.Fatalf("p50 %v p99 %v", r.P50, r.P99)
	}
	if rps := r.RPS(); rps < 99296 || rps > 99297 {
		t.Fatalf("rps %v", rps)
	}
	if _, err := ParseWrk([]byte("unable to connect to 127.0.0.1:1 Connection refused\n")); err == nil {
		t.Fatal("wrk failure parsed")
	}
}

func TestCostBodies(t *testing.T) {
	bodies := CostBodies(8, "llama", 1, false, 1)
	sessions := map[string]bool{}
	for i, b := range bodies {
		want := 2048
		if i%2 == 1 {
			want = 8192
		}
		if d := len(b.Body) - want; d < -8 || d > 8 {
			t.Errorf("body %d: %d bytes, want about %d", i, len(b.Body), want)
		}
		var v map[string]any
		if err := json.Unmarshal(b.Body, &v); err != nil {
			t.Fatalf("body %d is not JSON: %v", i, err)
		}
		if _, err := mock.ChatPromptTokens(b.Body); err != nil {
			t.Fatalf("body %d: mock rejects it: %v", i, err)
		}
		sessions[b.Session] = true
	}
	if len(sessions) < 2 || string(bodies[0].Body) == string(bodies[2].Body) {
		t.Fatal("bodies must vary")
	}
	if s := CostBodies(2, "llama", 8, true, 1); !strings.Contains(string(s[0].Body), `"stream":true`) {
		t.Fatal("stream flag missing")
	}
}

func TestWrkScript(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.lua")
	if err := WrkScript(p, LoadTarget{Path: "/internal/route", RouteHeaders: true}, CostBodies(2, "llama", 1, false, 1)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"function request()", `wrk.format("POST", "/internal/route"`, `["X-Original-URI"] = "/v1/chat/completions"`, "[==["} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q", want)
		}
	}
}

func TestTrivialHandlerAllocs(t *testing.T) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/internal/route")
	ctx.Request.SetBodyString(`{"model":"llama"}`)
	run := func() {
		ctx.Response.Reset()
		TrivialHandler(&ctx)
	}
	run()
	if got := string(ctx.Response.Header.Peek("X-Turnout-Server")); got != "r0" || ctx.Response.StatusCode() != 200 {
		t.Fatalf("server %q status %d", got, ctx.Response.StatusCode())
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("trivial handler allocates %v times", n)
	}
}

func TestPlainHAProxyConfig(t *testing.T) {
	cfg := string(PlainHAProxyConfig(PlainHAProxyOptions{
		Dir: "/tmp/x", Listen: "127.0.0.1:8080", Balance: "leastconn", BufSize: 1 << 16,
		Servers: []Endpoint{{Name: "r0", Address: "127.0.0.1:1"}, {Name: "r1", Address: "127.0.0.1:2"}},
	}))
	for _, want := range []string{"balance leastconn", "bind 127.0.0.1:8080", "server r1 127.0.0.1:2 check", "option http-no-delay", "tune.bufsize 65536"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "lua") {
		t.Error("the baseline must not load Lua")
	}
}

// --haproxy-nbthread N adds plain HAProxy and the default SPOE render at N
// threads, both plain rows baseline candidates; 0 adds none.
func TestCostNbthreadRows(t *testing.T) {
	o := CostOptions{HAProxy: "/bin/true", ProxyPolicy: "prefix-affinity", HAProxyNbthread: 1}
	l := zerolog.Nop()
	o.Log = &l
	stacks, _, err := proxyStacks(o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]proxyStack{}
	for _, s := range stacks {
		got[s.dir] = s
	}
	if s := got["plain-nbt"]; s.opts.Nbthread != 1 || !s.bestOf || !got["plain"].bestOf || got["plain"].opts.Nbthread != 0 {
		t.Errorf("plain rows: %+v / %+v", got["plain"], s)
	}
	if s := got["with-turnout-spoe-nbt"]; s.opts.Nbthread != 1 || s.bestOf || got["plain-wholebody"].bestOf {
		t.Errorf("spoe nbthread row %+v; only plain rows at default buffers are baselines", s)
	}
	if !strings.Contains(string(PlainHAProxyConfig(PlainHAProxyOptions{Nbthread: 1})), "    nbthread 1\n") {
		t.Error("plain config without nbthread 1")
	}
	if !strings.Contains(string(TurnoutConfig(ConfigOptions{HAProxyListen: "127.0.0.1:1", HAProxyNbthread: 1})), "haproxy:\n  listen: 127.0.0.1:1\n  nbthread: 1\n") {
		t.Error("turnout config without haproxy.nbthread")
	}
	o.HAProxyEnv = []string{"A=1", "B=2"}
	stacks, _, err = proxyStacks(o)
	if err != nil {
		t.Fatal(err)
	}
	envs := map[string]proxyStack{}
	for _, s := range stacks {
		if len(s.opts.HAProxyEnv) > 0 {
			envs[s.dir] = s
		}
	}
	if len(envs) != 2 || !envs["plain-env"].bestOf || envs["with-turnout-spoe-env"].bestOf || envs["plain-env"].name != "haproxy roundrobin, A=1 B=2" {
		t.Errorf("--haproxy-env rows: %+v", envs)
	}
	o.HAProxyNbthread, o.HAProxyEnv = 0, nil
	stacks, _, err = proxyStacks(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stacks {
		if s.opts.Nbthread != 0 || len(s.opts.HAProxyEnv) > 0 {
			t.Errorf("--haproxy-nbthread 0 and no --haproxy-env still add %s", s.name)
		}
	}
}

func TestBaselineRatios(t *testing.T) {
	rows := []CostRow{
		{Group: "g", RPS: 100, P50: 1, P99: 2, roundRPS: []float64{100, 50, 100}},
		{Group: "g", RPS: 80, P50: 1.5, P99: 4, roundRPS: []float64{90, 40, 70}},
	}
	applyGroupBaselines(rows)
	// Per round: 0.9, 0.8, 0.7 -> median 0.8.
	if rows[1].AddedP50 != 0.5 || rows[1].AddedP99 != 2 || rows[0].Ratio != 1 || math.Abs(rows[1].Ratio-0.8) > 1e-12 {
		t.Fatalf("rows %+v", rows)
	}
	if !rows[0].Baseline || rows[1].Baseline {
		t.Fatalf("baseline flags %v %v", rows[0].Baseline, rows[1].Baseline)
	}
	rows[1].roundRPS = []float64{95, 25, 99} // 0.95, 0.5, 0.99
	applyGroupBaselines(rows)
	if rows[1].Ratio != 0.95 {
		t.Fatalf("median of rounds %v, want 0.95", rows[1].Ratio)
	}
	// Without rounds (the probes), the ratio of the totals.
	rows[0].roundRPS, rows[1].roundRPS = nil, nil
	applyGroupBaselines(rows)
	if rows[1].Ratio != 0.8 {
		t.Fatalf("total ratio %v, want 0.8", rows[1].Ratio)
	}
}

// One interleaved run holds several groups; each row is compared with the
// first row of its own group, wherever that sits.
func TestGroupBaselines(t *testing.T) {
	rows := []CostRow{
		{Group: "haproxy", Target: "haproxy roundrobin", RPS: 1000, P50: 1, P99: 10, roundRPS: []float64{1000, 1000, 1000}},
		{Group: "haproxy", Target: "haproxy+lua+turnout", RPS: 300, P50: 3, P99: 20, roundRPS: []float64{300, 250, 350}},
		{Group: "nginx", Target: "nginx roundrobin", RPS: 2000, P50: 0.5, P99: 5, roundRPS: []float64{2000, 1000, 2000}},
		{Group: "nginx", Target: "nginx header", RPS: 800, P50: 1.5, P99: 6, roundRPS: []float64{800, 500, 1000}},
		{Group: "haproxy", Target: "late haproxy row", RPS: 500, P50: 2, P99: 12, roundRPS: []float64{500, 500, 500}},
		{Group: "nginx", Target: "nginx body", RPS: 600, P50: 2.5, P99: 9, roundRPS: []float64{500, 600, 700}},
	}
	applyGroupBaselines(rows)
	want := []struct {
		ratio, p50, p99 float64
		base            bool
	}{
		{1, 0, 0, true},
		{0.3, 2, 10, false}, // 0.30, 0.25, 0.35
		{1, 0, 0, true},     // its own group, not haproxy's
		{0.5, 1, 1, false},  // 0.40, 0.50, 0.50
		{0.5, 1, 2, false},  // against haproxy roundrobin, not its neighbour
		{0.35, 2, 4, false}, // 0.25, 0.60, 0.35
	}
	for i, w := range want {
		r := rows[i]
		if math.Abs(r.Ratio-w.ratio) > 1e-12 || math.Abs(r.AddedP50-w.p50) > 1e-12 || math.Abs(r.AddedP99-w.p99) > 1e-12 || r.Baseline != w.base {
			t.Errorf("%s: ratio %v +p50 %v +p99 %v baseline %v, want %+v", r.Target, r.Ratio, r.AddedP50, r.AddedP99, r.Baseline, w)
		}
	}
}

// With several plain configurations (bestOf), each round's baseline is the
// best of them: the proxy at its best in that round, not the first row.
func TestBestOfBaseline(t *testing.T) {
	rows := []CostRow{
		{Group: "haproxy", Target: "plain", RPS: 1000, P50: 1, roundRPS: []float64{1000, 800, 1000}, bestOf: true},
		{Group: "haproxy", Target: "plain, nbthread 1", RPS: 1100, P50: 1, roundRPS: []float64{900, 1000, 1200}, bestOf: true},
		{Group: "haproxy", Target: "plain, big buffers", RPS: 2000, P50: 1, roundRPS: []float64{2000, 2000, 2000}},
		{Group: "haproxy", Target: "with turnout", RPS: 600, P50: 2, roundRPS: []float64{600, 600, 600}},
		{Group: "nginx", Target: "nginx", RPS: 500, P50: 1, roundRPS: []float64{500, 500, 500}},
		{Group: "nginx", Target: "nginx+turnout", RPS: 250, P50: 1, roundRPS: []float64{250, 250, 250}},
	}
	applyGroupBaselines(rows)
	// Best plain per round: 1000, 1000, 1200 (a row not marked bestOf,
	// however fast, is no baseline).
	// plain: 1, 0.8, 0.833; nbthread 1: 0.9, 1, 1; big buffers: 2, 2, 1.67;
	// turnout: 0.6, 0.6, 0.5.
	want := []float64{1000.0 / 1200, 1, 2, 0.6, 1, 0.5}
	for i, w := range want {
		if math.Abs(rows[i].Ratio-w) > 1e-12 {
			t.Errorf("%s: ratio %v, want %v", rows[i].Target, rows[i].Ratio, w)
		}
	}
	if !rows[0].Baseline || rows[1].Baseline {
		t.Errorf("baseline flags %v %v: the first row stays the latency and memory baseline", rows[0].Baseline, rows[1].Baseline)
	}
}

// The probe rows print no rps and no ratio; skipped rows print their note.
func TestCostMarkdownProbesAndNotes(t *testing.T) {
	rows := []CostRow{
		{Group: "nginx-sse", Target: "nginx roundrobin", LoadGen: "sequential", Conns: 1, Requests: 5, P50: 0.3, P99: 1, Probe: true},
		{Group: "nginx", Target: "nginx+njs+turnout prefix-affinity", Note: "skipped: njs module not found"},
	}
	var b strings.Builder
	if err := WriteCostMarkdown(&b, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"| nginx-sse | nginx roundrobin | sequential c1 | - | - | 0.300 | 1.000 |", "| nginx | nginx+njs+turnout prefix-affinity | skipped: njs module not found |"} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
	if err := CheckCost(rows); err != nil {
		t.Fatalf("probe and note rows must pass the check: %v", err)
	}
}
