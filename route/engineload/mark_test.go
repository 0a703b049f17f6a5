package engineload

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/httpapi"
)

// markRig is a one-endpoint decider whose engine page lists one running
// request and calls during (a decision or a completion reaching turnout
// while the page is built) before writing it.
func markRig(t *testing.T, during func(srv *route.Decider)) (*route.Decider, *fleet.Endpoint) {
	t.Helper()
	var srv *route.Decider
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		during(srv)
		_, _ = w.Write([]byte(vllmPage(1, 0, 0.1)))
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
func scrapeOnce(t *testing.T, srv *route.Decider, ep *fleet.Endpoint) {
	t.Helper()
	New(srv, nil).Round(context.Background()) // returns at once: the scrape runs beside
	waitFor(t, "the scrape", func() bool { return ep.Engine() != nil })
}

// Issue 28 item 9: a decision made while the scrape is in flight, which the
// engine already counts in its page, is not counted twice (engine figure +
// in-flight change since the mark) until the next scrape.
func TestScrapeDuringDecisionNotOvercounted(t *testing.T) {
	srv, ep := markRig(t, func(srv *route.Decider) { apiCall(t, srv, route.PathRoute, markBody, 200) })
	scrapeOnce(t, srv, ep)
	if ep.Inflight() != 1 {
		t.Fatalf("engine %v, in flight %d", ep.Engine(), ep.Inflight())
	}
	if got := ep.Load(); got != 1 {
		t.Fatalf("load %d after a scrape that counted the one request decided during it, want 1", got)
	}
}

// A request in flight when the scrape started, whose completion reached
// turnout while the page was built (the engine still listed it), is not
// counted as running until the next scrape (it left a least-request
// replica unused for a whole interval in TestHAProxyLoRA).
func TestScrapeDuringCompletionNotOvercounted(t *testing.T) {
	var id string
	srv, ep := markRig(t, func(srv *route.Decider) { apiCall(t, srv, route.PathDone+"?id="+id, "", 204) })
	id = string(apiCall(t, srv, route.PathRoute, markBody, 200).Response.Header.Peek(route.HdrDecision))
	if ep.Inflight() != 1 || id == "" {
		t.Fatalf("in flight %d, decision %q before the scrape", ep.Inflight(), id)
	}
	scrapeOnce(t, srv, ep)
	if ep.Inflight() != 0 {
		t.Fatalf("in flight %d after the completion, want 0", ep.Inflight())
	}
	if got := ep.Load(); got != 0 {
		t.Fatalf("load %d after a scrape that listed a request completed during it, want 0", got)
	}
}
