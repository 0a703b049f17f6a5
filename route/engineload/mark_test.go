package engineload

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/httpapi"
)

// markRig is a one-endpoint decider whose engine answers each scrape with
// page(srv, n) for its n-th call (from 0), which may first make turnout see
// a decision or a completion while the page is in flight.
func markRig(t *testing.T, page func(srv *route.Decider, n int) string) (*route.Decider, *fleet.Endpoint) {
	t.Helper()
	var srv *route.Decider
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(page(srv, calls)))
		calls++
	})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
health: {disable: true}
feedback: {syslog: "127.0.0.1:0", sources: [127.0.0.1]}
engine_metrics: {interval: 1m, timeout: 1s, max_bytes: 1048576}
deployments:
  - name: llama
    policy: {name: least-request}
    pools: [{role: mixed, endpoints: [{name: m0, address: %s}]}]
`, ln.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	srv, err = route.New(cfg, route.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv, srv.Snapshot().Deployments[0].Serve.Endpoints[0]
}

// apiCall runs one request through turnout's HTTP API from loopback.
func apiCall(t *testing.T, srv *route.Decider, uri, body string, want int) *fasthttp.RequestCtx {
	t.Helper()
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.SetRequestURI(uri)
	req.Header.SetMethod("POST")
	req.SetBodyString(body)
	ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 40000}, nil)
	httpapi.New(srv).Handler(&ctx)
	if ctx.Response.StatusCode() != want {
		t.Errorf("%s: status %d, want %d: %s", uri, ctx.Response.StatusCode(), want, ctx.Response.Body())
	}
	return &ctx
}

const markBody = `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`

// scrapeOnce runs one scrape round and waits for its figure.
func scrapeOnce(t *testing.T, srv *route.Decider, ep *fleet.Endpoint) *Scraper {
	t.Helper()
	sc := New(srv, nil)
	sc.Round(context.Background()) // returns at once: the scrape runs beside
	waitFor(t, "the scrape", func() bool { return ep.Engine() != nil })
	return sc
}

// refetched is the scraper's turnout_engine_scrapes_refetched_total, summed.
func refetched(t *testing.T, sc *Scraper) (n int) {
	t.Helper()
	var b strings.Builder
	sc.WriteMetrics(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "turnout_engine_scrapes_refetched_total{") {
			var v int
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			n += v
		}
	}
	return n
}

// Issue 28 item 9: a decision made while the scrape is in flight, which the
// engine already counts in its page, is not counted twice (engine figure +
// in-flight change since the mark) until the next scrape.
func TestScrapeDuringDecisionNotOvercounted(t *testing.T) {
	srv, ep := markRig(t, func(srv *route.Decider, _ int) string {
		apiCall(t, srv, contract.PathRoute, markBody, 200)
		return vllmPage(1, 0, 0.1)
	})
	scrapeOnce(t, srv, ep)
	if ep.Inflight() != 1 {
		t.Fatalf("engine %v, in flight %d", ep.Engine(), ep.Inflight())
	}
	if got := ep.Load(); got != 1 {
		t.Fatalf("load %d after a scrape that counted the one request decided during it, want 1", got)
	}
}

// openDecisions routes n requests and returns their decision ids.
func openDecisions(t *testing.T, srv *route.Decider, ep *fleet.Endpoint, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		ids = append(ids, string(apiCall(t, srv, contract.PathRoute, markBody, 200).Response.Header.Peek(contract.HdrDecision)))
	}
	if ep.Inflight() != int64(n) {
		t.Fatalf("in flight %d before the scrape, want %d", ep.Inflight(), n)
	}
	return ids
}

// A request in flight when the scrape started, whose completion reached
// turnout while the page was in flight and which the page still listed as
// running, is not counted as running until the next scrape (it left a
// least-request replica unused in TestHAProxyLoRA): the page is fetched
// again, after the completion.
func TestScrapeDuringCompletionNotOvercounted(t *testing.T) {
	var ids []string
	srv, ep := markRig(t, func(srv *route.Decider, n int) string {
		if n == 0 {
			apiCall(t, srv, contract.PathDone+"?id="+ids[0], "", 204)
			return vllmPage(1, 0, 0.1) // finished after the page was built
		}
		return vllmPage(0, 0, 0.1)
	})
	ids = openDecisions(t, srv, ep, 1)
	sc := scrapeOnce(t, srv, ep)
	if got := ep.Load(); got != 0 || ep.Inflight() != 0 {
		t.Fatalf("load %d (in flight %d) after a scrape that listed a request completed during it, want 0", got, ep.Inflight())
	}
	if n := refetched(t, sc); n != 1 {
		t.Fatalf("%d scrapes fetched twice, want 1", n)
	}
}

// The same completion when the engine had finished it before building the
// page: the other request still running is not under-counted (flow control
// would hand the engine one request too many, into a critical request's
// headroom).
func TestScrapeDuringCompletionNotUndercounted(t *testing.T) {
	var ids []string
	srv, ep := markRig(t, func(srv *route.Decider, n int) string {
		if n == 0 {
			apiCall(t, srv, contract.PathDone+"?id="+ids[0], "", 204)
		}
		return vllmPage(1, 0, 0.1) // the other request
	})
	ids = openDecisions(t, srv, ep, 2)
	scrapeOnce(t, srv, ep)
	if got := ep.Load(); got != 1 || ep.Inflight() != 1 {
		t.Fatalf("load %d (in flight %d) with one request running, want 1", got, ep.Inflight())
	}
}
