package bench

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
)

// Pre-built header names and values: the trivial handler must not allocate.
var (
	hdrServerB    = []byte(contract.HdrServer)
	hdrBackendB   = []byte(contract.HdrBackend)
	hdrPoolB      = []byte(contract.HdrPool)
	hdrFallbacksB = []byte(contract.HdrFallbacks)
	hdrDecisionB  = []byte(contract.HdrDecision)
	trivServer    = []byte("r0")
	trivBackend   = []byte("127.0.0.1:18000")
	trivPool      = []byte("bench_mixed")
	trivFallback  = []byte("r1,r2")
	trivDecision  = []byte("0000000000000001")
)

// TrivialHandler answers every request like /internal/route does, with
// fixed verdict headers and no work: the floor a decision is compared to.
func TrivialHandler(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.SetBytesKV(hdrServerB, trivServer)
	h.SetBytesKV(hdrBackendB, trivBackend)
	h.SetBytesKV(hdrPoolB, trivPool)
	h.SetBytesKV(hdrFallbacksB, trivFallback)
	h.SetBytesKV(hdrDecisionB, trivDecision)
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// NewTrivialServer uses the route server's settings (route.NewHTTPServer)
// so only the handler differs.
func NewTrivialServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler: TrivialHandler, Name: "turnout", NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true,
		MaxRequestBodySize: 4*(256<<10) + 1<<20, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 5 * time.Minute,
	}
}
