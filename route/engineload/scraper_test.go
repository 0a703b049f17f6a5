package engineload

import (
	"github.com/turnout/turnout/route/httpapi"

	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// vllmPage is the shape of a vLLM v1 page: one series per engine, labels,
// histograms around the gauges.
func vllmPage(running, waiting int, kv float64) string {
	return fmt.Sprintf(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} %d
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} %g
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 0.25
`, running, waiting, kv)
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		page string
		want int64
		kv   float64
		res  Result
		bs   int
	}{
		{"cache config block size", vllmPage(1, 0, 0.5) + "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"32\",cache_dtype=\"auto\"} 1.0\n", 1, 0.5, ResultOK, 32},
		{"cache config without a size", vllmPage(1, 0, 0.5) + "vllm:cache_config_info{block_size=\"None\"} 1.0\n", 1, 0.5, ResultOK, 0},
		{"vllm v1", vllmPage(3, 20, 0.25), 23, 0.25, ResultOK, 0},
		{"two engines summed, kv max", vllmPage(1, 1, 0.5) + "vllm:num_requests_running{engine=\"1\",model_name=\"llama\"} 4\nvllm:kv_cache_usage_perc{engine=\"1\",model_name=\"llama\"} 0.75\n", 6, 0.75, ResultOK, 0},
		{"old kv name", "vllm:num_requests_running 2\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.1\n", 2, 0.1, ResultOK, 0},
		{"no kv", "vllm:num_requests_waiting 7\n", 7, -1, ResultOK, 0},
		{"other exporter", "# TYPE up gauge\nup 1\n", 0, 0, ResultNoMetrics, 0},
		{"garbage", "\x00\x01{{{ not prometheus at all\n", 0, 0, ResultParse, 0},
		{"realistic page, filtered", string(realisticPage()), 10, 0.42, ResultOK, 0},
		{"longer names ignored", "vllm:num_requests_running_total 99\nvllm:num_requests_waiting 1\n", 1, -1, ResultOK, 0},
		{"bad line among kept ones", "vllm:num_requests_running{a=\"1\"} 2\nvllm:num_requests_waiting{ 3\n", 0, 0, ResultParse, 0},
		{"bad value", "vllm:num_requests_running abc\n", 0, 0, ResultParse, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, res, err := Parse([]byte(tc.page))
			if res != tc.res {
				t.Fatalf("result %v (%v), want %v", res, err, tc.res)
			}
			if res == ResultOK && (l.Requests != tc.want || l.KVUsage != tc.kv || l.BlockSize != tc.bs) {
				t.Fatalf("load %+v, want requests %d kv %v block size %d", l, tc.want, tc.kv, tc.bs)
			}
			// Pages with vLLM's TTFT histogram (vllmPage: sum 0.25 s, count 3).
			wantN, wantSum := uint64(0), 0.0
			if strings.Contains(tc.page, "time_to_first_token_seconds_count") {
				wantN, wantSum = 3, 0.25
			}
			if res == ResultOK && (l.TTFTCount != wantN || l.TTFTSeconds != wantSum) {
				t.Fatalf("ttft sum %v count %d, want %v and %d", l.TTFTSeconds, l.TTFTCount, wantSum, wantN)
			}
			if res != ResultOK && err == nil {
				t.Fatal("failure without an error")
			}
		})
	}
}

// page is a switchable /metrics handler.
type page struct {
	mu   sync.Mutex
	mode string
	body string
}

func (p *page) set(mode, body string) {
	p.mu.Lock()
	p.mode, p.body = mode, body
	p.mu.Unlock()
}

func (p *page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	mode, body := p.mode, p.body
	p.mu.Unlock()
	switch mode {
	case "missing":
		http.NotFound(w, r)
	case "huge":
		// 10 MB of plausible lines, streamed.
		line := []byte("vllm:num_requests_running{model_name=\"llama\"} 1\n")
		for n := 0; n < 10<<20; n += len(line) {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	case "stall":
		select {
		case <-r.Context().Done():
		case <-time.After(3 * time.Second):
		}
	default:
		_, _ = w.Write([]byte(body))
	}
}

// oneReplica is a decider over one replica m0 at addr (least-request,
// health checks off) with the given engine_metrics section.
func oneReplica(t *testing.T, engineMetrics, addr string) *route.Decider {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
health: {disable: true}
engine_metrics: %s
deployments:
  - name: llama
    policy: {name: least-request, params: {choices: 0}}
    pools: [{role: mixed, endpoints: [{name: m0, address: %s}]}]
`, engineMetrics, addr)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := route.New(cfg, route.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

func startPage(t *testing.T, p *page) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: p}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func routeOnce(t *testing.T, srv *route.Decider) (string, time.Duration) {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetBodyString(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
	start := time.Now()
	httpapi.New(srv).Handler(&ctx)
	took := time.Since(start)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("route status %d", ctx.Response.StatusCode())
	}
	var id uint64
	fmt.Sscanf(string(ctx.Response.Header.Peek(contract.HdrDecision)), "%x", &id)
	if !srv.Ledger().Complete(id) {
		t.Fatal("decision not completable")
	}
	return string(ctx.Response.Header.Peek(contract.HdrServer)), took
}

// Every kind of bad page is counted by kind, logged once per state change,
// falls back to in-flight counts, and never holds a decision; a good page
// afterwards restores the engine figure.
func TestScraperBadPages(t *testing.T) {
	p := &page{}
	srv := oneReplica(t, "{interval: 300ms, timeout: 1s, max_bytes: 1048576}", startPage(t, p))
	var logs syncBuf
	log := zerolog.New(&logs)
	sc := New(srv, &log)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go sc.Run(ctx)
	ep := srv.Snapshot().Deployments[0].Serve.Endpoints[0]

	p.set("ok", vllmPage(2, 20, 0.5))
	waitFor(t, "engine figure", func() bool { return ep.Engine() != nil && ep.Engine().Requests == 22 })
	if ep.Load() != 22 {
		t.Fatalf("load %d, want 22", ep.Load())
	}
	for _, tc := range []struct {
		mode, body string
		res        Result
	}{
		{"ok", "\x00garbage{{{\n", ResultParse},
		{"huge", "", ResultTooLarge},
		{"stall", "", ResultTimeout},
		{"missing", "", ResultStatus},
		{"ok", "# TYPE up gauge\nup 1\n", ResultNoMetrics},
	} {
		t.Run(tc.res.String(), func(t *testing.T) {
			p.set("ok", vllmPage(2, 20, 0.5))
			waitFor(t, "recovery", func() bool { return sc.LastResult("m0") == "ok" && ep.Engine() != nil })
			warns := logs.count(`"result":"` + tc.res.String() + `"`)
			p.set(tc.mode, tc.body)
			waitFor(t, tc.res.String(), func() bool { return sc.LastResult("m0") == tc.res.String() })
			if ep.Engine() != nil {
				t.Fatal("engine figure kept after a failed scrape")
			}
			ep.AddInflight(5)
			if ep.Load() != 5 {
				t.Fatalf("load %d, want the in-flight count 5", ep.Load())
			}
			ep.AddInflight(-5)
			// Decisions while scrapes keep failing (stalling): never held. A
			// decision waiting on a scrape would take the 1 s timeout.
			for i := 0; i < 20; i++ {
				if _, took := routeOnce(t, srv); took > 500*time.Millisecond {
					t.Fatalf("decision took %s during %s scrapes", took, tc.res)
				}
			}
			// Several failed scrapes of the same kind: one log line.
			failed := func() uint64 {
				sc.mu.Lock()
				defer sc.mu.Unlock()
				return sc.eps["m0"].results[tc.res].Load()
			}
			n := failed()
			waitFor(t, "two more failures", func() bool { return failed() >= n+2 })
			if got := logs.count(`"result":"`+tc.res.String()+`"`) - warns; got != 1 {
				t.Fatalf("%d log lines for one state change, want 1", got)
			}
		})
	}
	var b strings.Builder
	sc.WriteMetrics(&b)
	familiesTogether(t, b.String())
	for _, r := range []string{"ok", "parse_error", "too_large", "timeout", "http_status", "no_metrics"} {
		if !strings.Contains(b.String(), fmt.Sprintf(`,endpoint="m0",result=%q} `, r)) ||
			strings.Contains(b.String(), fmt.Sprintf(`,endpoint="m0",result=%q} 0`+"\n", r)) {
			t.Fatalf("result %s not counted:\n%s", r, b.String())
		}
	}
}

// Disabling scraping (live) drops the engine figures.
func TestScraperDisable(t *testing.T) {
	p := &page{}
	p.set("ok", vllmPage(1, 2, 0.1))
	addr := startPage(t, p)
	y := `
health: {disable: true}
engine_metrics: {interval: 20ms, disable: %v}
deployments:
  - name: llama
    pools: [{role: mixed, endpoints: [{name: m0, address: %s}]}]
`
	cfg, _ := config.ParseConfig([]byte(fmt.Sprintf(y, false, addr)))
	srv, err := route.New(cfg, route.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sc := New(srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go sc.Run(ctx)
	ep := srv.Snapshot().Deployments[0].Serve.Endpoints[0]
	waitFor(t, "engine figure", func() bool { return ep.Engine() != nil })
	cfg2, _ := config.ParseConfig([]byte(fmt.Sprintf(y, true, addr)))
	if err := srv.Apply(cfg2); err != nil {
		t.Fatal(err)
	}
	ep = srv.Snapshot().Deployments[0].Serve.Endpoints[0]
	waitFor(t, "figure dropped", func() bool { return ep.Engine() == nil })
}

// familiesTogether fails unless each family's samples stand together after
// its # HELP/# TYPE lines, as the text format asks.
func familiesTogether(t *testing.T, text string) {
	t.Helper()
	done := map[string]bool{}
	cur := ""
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		var name string
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, _, _ = strings.Cut(rest, " ")
		} else if strings.HasPrefix(line, "#") {
			continue
		} else {
			name = line[:strings.IndexAny(line, "{ ")]
		}
		if name == cur {
			continue
		}
		if done[name] {
			t.Fatalf("family %s continues after %s's samples began:\n%s", name, cur, text)
		}
		done[cur], cur = true, name
	}
}

// A busy replica is scraped every interval: reading its page must not
// allocate (the scrapes were the serve process's one allocation per SPOE
// request under load, BENCHMARKS.md set L-t2).
func TestParseAllocs(t *testing.T) {
	for name, page := range map[string][]byte{
		"realistic": realisticPage(),
		"cache config, two engines": []byte(vllmPage(3, 1, 0.5) + "vllm:cache_config_info{block_size=\"16\"} 1.0\n" +
			"vllm:num_requests_running{engine=\"1\",model_name=\"llama\"} 4\n"),
	} {
		if _, res, err := Parse(page); res != ResultOK {
			t.Fatalf("%s: %v %v", name, res, err)
		}
		if n := testing.AllocsPerRun(100, func() { _, _, _ = Parse(page) }); n != 0 {
			t.Errorf("%s: %v allocations per page", name, n)
		}
	}
}

// The text format's corners on the lines Parse reads: escaped quotes and
// braces in label values, a timestamp, CRLF line ends, a trailing comma.
func TestParseTextCorners(t *testing.T) {
	page := "vllm:num_requests_running{model_name=\"a\\\"}b\",engine=\"0\",} 2 1700000000000\r\n" +
		"vllm:num_requests_waiting{model_name=\"x\\\\\"} 3\r\n" +
		"vllm:kv_cache_usage_perc 0.5\r\n" +
		"vllm:time_to_first_token_seconds_count{engine=\"0\"} 4\n" +
		"vllm:time_to_first_token_seconds_sum{engine=\"0\"} 0.5\n" +
		"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a\\\"b, c\",waiting_lora_adapters=\"\"} 5\n"
	l, res, err := Parse([]byte(page))
	if res != ResultOK {
		t.Fatalf("%v %v", res, err)
	}
	if l.Requests != 5 || l.Waiting != 3 || l.KVUsage != 0.5 || l.TTFTCount != 4 || l.TTFTSeconds != 0.5 {
		t.Fatalf("%+v", l)
	}
	if l.LoRA == nil || len(l.LoRA.Running) != 2 || l.LoRA.Running[0] != `a"b` || l.LoRA.Running[1] != "c" || l.LoRA.MaxLoRA != 2 {
		t.Fatalf("lora %+v", l.LoRA)
	}
	for _, bad := range []string{
		"vllm:num_requests_running{engine=\"0\" 2\n",
		"vllm:num_requests_running{engine=0} 2\n",
		"vllm:num_requests_running{engine=\"0\"}\n",
		"vllm:num_requests_running 2 soon\n",
		"vllm:num_requests_running{1engine=\"0\"} 2\n",
	} {
		if _, res, err := Parse([]byte(bad)); res != ResultParse || err == nil {
			t.Errorf("%q: %v %v, want a parse error", bad, res, err)
		}
	}
}
