package httpapi

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/feedback"
	"github.com/turnout/turnout/route/internal/routetest"
)

// testServer is a Decider with its HTTP API (and its feedback loop), as
// cmd/turnout wires them.
type testServer struct {
	*route.Decider
	*API
}

func mustServer(t testing.TB, y string) *testServer {
	t.Helper()
	d, err := route.New(routetest.MustConfig(t, y), route.Options{Seed: 42})
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	feedback.New(d) // as cmd/turnout wires it: /readyz?verbose and /metrics include it
	return &testServer{d, New(d)}
}

// do sends one /internal/route request through the handler.
func do(s *testServer, body string, hdrs ...string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.DisableNormalizing()
	for i := 0; i+1 < len(hdrs); i += 2 {
		ctx.Request.Header.Set(hdrs[i], hdrs[i+1])
	}
	ctx.Request.SetBodyString(body)
	s.Handler(&ctx)
	return &ctx
}

func hdr(ctx *fasthttp.RequestCtx, k string) string { return string(ctx.Response.Header.Peek(k)) }

var chatBody = routetest.ChatBody

const fourEndpoints = routetest.FourEndpoints
