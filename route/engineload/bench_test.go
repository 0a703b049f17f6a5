package engineload

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/route"
)

// realisticPage approximates a vLLM v1 /metrics page for one model: the
// load gauges, a dozen counters and 14 histograms of ~20 buckets (TTFT,
// ITL, e2e, queue, prefill, decode, token counts...), plus the Python
// process collectors; about 60 KiB, ~470 lines.
func realisticPage() []byte {
	var b strings.Builder
	lbl := `engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"`
	b.WriteString(vllmPage(7, 3, 0.42))
	for _, n := range []string{"python_gc_objects_collected_total", "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s gauge\n%s 12345.0\n", n, n, n)
	}
	for _, n := range []string{"prompt_tokens_total", "generation_tokens_total", "num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total"} {
		fmt.Fprintf(&b, "# HELP vllm:%s x\n# TYPE vllm:%s counter\nvllm:%s{%s} 1.234567e+06\n", n, n, n, lbl)
	}
	for _, r := range []string{"stop", "length", "abort", "error"} {
		fmt.Fprintf(&b, "vllm:request_success_total{%s,finished_reason=%q} 4242.0\n", lbl, r)
	}
	for h := 0; h < 14; h++ {
		n := fmt.Sprintf("vllm:histogram_%d_seconds", h)
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s histogram\n", n, n)
		for i := 0; i < 20; i++ {
			fmt.Fprintf(&b, "%s_bucket{%s,le=\"%g\"} %d.0\n", n, lbl, 0.001*float64(int(1)<<i), i*100)
		}
		fmt.Fprintf(&b, "%s_bucket{%s,le=\"+Inf\"} 2000.0\n%s_count{%s} 2000.0\n%s_sum{%s} 1234.5\n", n, lbl, n, lbl, n, lbl)
	}
	return []byte(b.String())
}

// BenchmarkParse is the CPU cost of reading one page with expfmt.
func BenchmarkParse(b *testing.B) {
	page := realisticPage()
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, res, err := Parse(page); res != ResultOK {
			b.Fatal(err)
		}
	}
}

// BenchmarkScrape is one whole scrape of one endpoint over loopback: GET,
// read, parse, publish.
func BenchmarkScrape(b *testing.B) {
	page := realisticPage()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) })}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: llama
    pools: [{role: mixed, endpoints: [{name: m0, address: %s}]}]
`, ln.Addr())))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := route.New(cfg, route.Options{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	sc := New(srv, nil)
	t := &target{name: "m0"}
	eps := srv.Snapshot().Deployments[0].Serve.Endpoints
	ecfg := srv.Snapshot().Config.EngineMetrics
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sc.scrapeOne(context.Background(), t, eps, &ecfg)
	}
	b.StopTimer()
	if t.results[ResultOK].Load() != uint64(b.N) {
		b.Fatalf("%d of %d scrapes ok", t.results[ResultOK].Load(), b.N)
	}
	b.ReportMetric(float64(len(page)), "page-bytes")
}
