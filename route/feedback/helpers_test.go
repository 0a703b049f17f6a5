package feedback

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/httpapi"
	"github.com/turnout/turnout/route/internal/routetest"
)

// testServer is a Decider with its feedback loop and HTTP API, wired as
// cmd/turnout wires them.
type testServer struct {
	*route.Decider
	*Loop
	api *httpapi.API
}

func newServer(t testing.TB, cfg *config.Config, opts route.Options) (*testServer, error) {
	t.Helper()
	d, err := route.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	return &testServer{d, New(d), httpapi.New(d)}, nil
}

func mustServer(t testing.TB, y string) *testServer {
	t.Helper()
	s, err := newServer(t, routetest.MustConfig(t, y), route.Options{Seed: 42})
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	return s
}

// do sends one /internal/route request through the HTTP handler.
func do(s *testServer, body string, hdrs ...string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.DisableNormalizing()
	for i := 0; i+1 < len(hdrs); i += 2 {
		ctx.Request.Header.Set(hdrs[i], hdrs[i+1])
	}
	ctx.Request.SetBodyString(body)
	s.api.Handler(&ctx)
	return &ctx
}

func routeCtx(body string, session string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.Set("Content-Type", "application/json")
	ctx.Request.Header.Set(contract.HdrOriginalURI, "/v1/chat/completions")
	ctx.Request.Header.Set(contract.HdrOriginalMethod, "POST")
	if session != "" {
		ctx.Request.Header.Set("X-Session-Id", session)
	}
	ctx.Request.SetBodyString(body)
	return &ctx
}

func hdr(ctx *fasthttp.RequestCtx, k string) string { return string(ctx.Response.Header.Peek(k)) }

var (
	chatBody   = routetest.ChatBody
	body4K     = routetest.Body4K
	mustConfig = routetest.MustConfig
)

const fourEndpoints = routetest.FourEndpoints
