package httpapi

import (
	"fmt"
	"runtime"
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
func assertZeroAllocs(t *testing.T, s *testServer, ctx *fasthttp.RequestCtx) {
	t.Helper()
	run := func() {
		ctx.Response.Reset()
		s.Handler(ctx)
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
	for _, pol := range []string{"least-request", "session-hash", "prefix-affinity", "round-robin", "predicted-ttft"} {
		t.Run(pol, func(t *testing.T) {
			assertZeroAllocs(t, mustServer(t, fmt.Sprintf(fourEndpoints, pol)), routeCtx(body4K(1), "user-1"))
		})
	}
	t.Run("asked fields", func(t *testing.T) {
		ctx := routeCtx(body4K(1), "user-1")
		ctx.Request.Header.Set(contract.HdrWant, "fallback_addr")
		assertZeroAllocs(t, mustServer(t, fmt.Sprintf(fourEndpoints, "least-request")), ctx)
		if len(ctx.Response.Header.Peek(contract.HdrFallbackBackend)) == 0 {
			t.Fatalf("asked %s missing", contract.HdrFallbackBackend)
		}
	})
}

func benchRoute(b *testing.B, pol string, bodies int) {
	s := mustServer(b, fmt.Sprintf(fourEndpoints, pol))
	ctxs := make([]*fasthttp.RequestCtx, bodies)
	for i := range ctxs {
		ctxs[i] = routeCtx(body4K(i), fmt.Sprintf("user-%d", i%97))
	}
	decide := func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Reset()
		s.Handler(ctx)
		id, _ := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		s.Ledger().Complete(id)
	}
	// Warm every context (fasthttp's response buffers, the policy's state)
	// so even a short run (make bench-smoke: -benchtime 100x) reports the
	// steady state, 0 allocs/op, not first-use allocations spread over 100.
	for _, ctx := range ctxs {
		decide(ctx)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(ctxs[0].Request.Body())))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		decide(ctxs[i%bodies])
	}
}

func BenchmarkRouteLeastRequest(b *testing.B)   { benchRoute(b, "least-request", 64) }
func BenchmarkRouteSessionHash(b *testing.B)    { benchRoute(b, "session-hash", 64) }
func BenchmarkRoutePrefixAffinity(b *testing.B) { benchRoute(b, "prefix-affinity", 64) }
func BenchmarkRouteRoundRobin(b *testing.B)     { benchRoute(b, "round-robin", 64) }
func BenchmarkRoutePredictedTTFT(b *testing.B)  { benchRoute(b, "predicted-ttft", 64) }

func BenchmarkRouteParallelPrefixAffinity(b *testing.B) {
	s := mustServer(b, fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	// One warmed context per RunParallel goroutine, built before the timer.
	ctxs := make(chan *fasthttp.RequestCtx, runtime.GOMAXPROCS(0))
	for range cap(ctxs) {
		ctx := routeCtx(body4K(7), "u")
		s.Handler(ctx)
		id, _ := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		s.Ledger().Complete(id)
		ctxs <- ctx
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := <-ctxs
		for pb.Next() {
			ctx.Response.Reset()
			s.Handler(ctx)
			id, _ := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
			s.Ledger().Complete(id)
		}
	})
}

func FuzzRouteHandler(f *testing.F) {
	s := mustServer(f, fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	f.Add([]byte(body4K(1)), "sess", "llama", "")
	f.Add([]byte(`{"model":"nope"}`), "", "", "")
	f.Add([]byte(`{{{`), "", "x", "10/20")
	f.Fuzz(func(t *testing.T, body []byte, session, modelHdr, trunc string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(contract.PathRoute)
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.Header.Set("X-Session-Id", session)
		ctx.Request.Header.Set("X-Model", modelHdr)
		ctx.Request.Header.Set(contract.HdrBodyTruncated, trunc)
		ctx.Request.SetBody(body)
		s.Handler(&ctx)
		switch st := ctx.Response.StatusCode(); st {
		case 200, 400, 404, 413, 503:
		default:
			t.Fatalf("status %d", st)
		}
		if id, ok := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision)); ok {
			s.Ledger().Complete(id)
		}
	})
}

// The guard keeps the decision path allocation-free.
func TestDecisionAllocsBoundedLoad(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity, params: {bounded_load: 0.5}"))
	for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
		e.StartWindow()
	}
	assertZeroAllocs(t, s, routeCtx(body4K(1), "user-1"))
}
