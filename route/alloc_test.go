package route

import (
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
)

var body4K = routetest.Body4K

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

// assertZeroAllocs routes ctx repeatedly (each decision completed, so
// in-flight counts stay flat) and fails unless a warm decision allocates
// nothing.
func assertZeroAllocs(t *testing.T, s *Decider, ctx *fasthttp.RequestCtx) {
	t.Helper()
	run := func() {
		ctx.Response.Reset()
		handle(s, ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		id, _ := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		s.Ledger().Complete(id)
	}
	for i := 0; i < 100; i++ { // warm pools, the prefix index, caches
		run()
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("%v allocations per decision", n)
	}
}

// Zero allocations per decision is a contract, not a hope.
func TestDecisionAllocs(t *testing.T) {
	for _, pol := range []string{"least-request", "session-hash", "prefix-affinity", "round-robin"} {
		t.Run(pol, func(t *testing.T) {
			assertZeroAllocs(t, mustServer(t, fmt.Sprintf(fourEndpoints, pol)), routeCtx(body4K(1), "user-1"))
		})
	}
}

// The guard keeps the decision path allocation-free.
func TestDecisionAllocsBoundedLoad(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity, params: {bounded_load: 0.5}"))
	for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
		e.StartWindow()
	}
	assertZeroAllocs(t, s, routeCtx(body4K(1), "user-1"))
}
