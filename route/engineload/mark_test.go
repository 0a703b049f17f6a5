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
	"github.com/turnout/turnout/route/httpapi"
)

// Issue 28 item 9: a decision made while the scrape is in flight, which the
// engine already counts in its page, is not counted twice (engine figure +
// in-flight change since the mark) until the next scrape.
func TestScrapeDuringDecisionNotOvercounted(t *testing.T) {
	var srv *route.Decider
	api := func() *httpapi.API { return httpapi.New(srv) }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A request is decided and reaches the engine while the page is built.
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(route.PathRoute)
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetBodyString(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
		api().Handler(&ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Errorf("route status %d", ctx.Response.StatusCode())
		}
		_, _ = w.Write([]byte(vllmPage(1, 0, 0.1)))
	})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
health: {disable: true}
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
	defer srv.Close()
	sc := New(srv, nil)
	sc.Round(context.Background()) // returns at once: the scrape runs beside
	ep := srv.Snapshot().Deployments[0].Serve.Endpoints[0]
	waitFor(t, "the scrape", func() bool { return ep.Engine() != nil })
	if ep.Inflight() != 1 {
		t.Fatalf("engine %v, in flight %d", ep.Engine(), ep.Inflight())
	}
	if got := ep.Load(); got != 1 {
		t.Fatalf("load %d after a scrape that counted the one request decided during it, want 1", got)
	}
}
