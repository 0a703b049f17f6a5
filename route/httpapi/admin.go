package httpapi

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
)

// AdminHandler serves the admin listener (admin_listen): health, readiness
// and metrics, the paths a kubelet and Prometheus need from outside the
// pod. The decision and completion paths (/internal/*) are never served
// there: whoever reaches the admin port must not be able to make or close
// decisions (docs/kubernetes.md, threat model).
func (a *API) AdminHandler(ctx *fasthttp.RequestCtx) {
	if !a.serveAdmin(ctx) {
		a.refuse(ctx, fasthttp.StatusNotFound, "invalid_request_error", "not_found",
			"no such path; turnout's admin listener serves "+contract.PathHealthz+", "+contract.PathReadyz+" and "+contract.PathMetrics)
	}
}

// serveAdmin answers the paths both listeners serve (health, readiness,
// metrics); false for any other path.
func (a *API) serveAdmin(ctx *fasthttp.RequestCtx) bool {
	switch string(ctx.Path()) {
	case contract.PathHealthz:
		healthz(ctx)
	case contract.PathReadyz:
		a.ready(ctx)
	case contract.PathMetrics:
		a.metrics(ctx)
	default:
		return false
	}
	return true
}

// healthz answers liveness: the process serves HTTP.
func healthz(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetBodyString("ok\n")
}

// NewAdminHTTPServer returns the admin listener's server. Its clients send
// no bodies and few requests, so it is small and bounded: a flood on an
// exposed admin port cannot take memory from the decision path.
func (a *API) NewAdminHTTPServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:               a.AdminHandler,
		ErrorHandler:          a.errorHandler,
		Name:                  "turnout",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		MaxRequestBodySize:    4 << 10,
		Concurrency:           256,
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		ReduceMemoryUsage:     true,
		Logger:                fasthttpLogger{a.d.Log()},
	}
}
