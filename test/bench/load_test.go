package bench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/test/mockvllm"
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
		if _, err := mockvllm.ChatPromptTokens(b.Body); err != nil {
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

func TestBaselineRatios(t *testing.T) {
	rows := []CostRow{
		{RPS: 100, P50: 1, P99: 2, roundRPS: []float64{100, 50, 100}},
		{RPS: 80, P50: 1.5, P99: 4, roundRPS: []float64{90, 40, 70}},
	}
	applyBaseline(rows)
	if rows[1].AddedP50 != 0.5 || rows[1].AddedP99 != 2 || rows[0].Ratio != 1 || rows[1].Ratio != 0.8 {
		t.Fatalf("rows %+v", rows)
	}
	applyRoundRatios(rows)
	// Per round: 0.9, 0.8, 0.7 -> median 0.8.
	if rows[0].Ratio != 1 || math.Abs(rows[1].Ratio-0.8) > 1e-12 {
		t.Fatalf("round ratios %v %v", rows[0].Ratio, rows[1].Ratio)
	}
	rows[1].roundRPS = []float64{95, 25, 99} // 0.95, 0.5, 0.99
	applyRoundRatios(rows)
	if rows[1].Ratio != 0.95 {
		t.Fatalf("median of rounds %v, want 0.95", rows[1].Ratio)
	}
}
