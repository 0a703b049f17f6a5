package httpapi

import (
	"bytes"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// API serves turnout's HTTP endpoints for one Decider: POST
// /internal/route (the proxy's call, answered with X-Turnout-* headers),
// /internal/done (completion feedback), /healthz, /readyz and /metrics.
type API struct {
	d *route.Decider
	// budget counts request body bytes held across in-flight requests.
	budget bodyBudget
	// hdrs are the routed fields' header names, pre-built for fasthttp.
	hdrs [][]byte
}

// New returns the HTTP API of d.
func New(d *route.Decider) *API {
	a := &API{d: d}
	for _, f := range contract.RoutedFields() {
		a.hdrs = append(a.hdrs, []byte(f.Header))
	}
	return a
}

var hdrFallbacksB = []byte(contract.HdrFallbacks)

// Handler is the fasthttp entry point.
func (a *API) Handler(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case contract.PathRoute:
		a.routeHTTP(ctx)
	case contract.PathDone:
		a.done(ctx)
	default:
		if a.serveAdmin(ctx) {
			return
		}
		if bytes.HasPrefix(ctx.Path(), pathDecisionB) {
			a.decision(ctx) // decision.go
			return
		}
		a.refuse(ctx, fasthttp.StatusNotFound, "invalid_request_error", "not_found", "no such path; turnout serves "+contract.PathRoute)
	}
}

// routeHTTP reads the proxy's call into an Input, decides, and writes the
// Verdict as headers (or an error answer).
func (a *API) routeHTTP(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		a.refuse(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use POST "+contract.PathRoute)
		return
	}
	t := a.d.Begin()
	defer a.d.End(t)
	cfg := t.Config()
	t.ProxyHeaders(&ctx.Request.Header)
	body, more, held, err := a.readBody(ctx, t, cfg)
	defer a.budget.give(held, cfg.Limits.MaxBufferedBytes)
	if err != nil {
		return // answered
	}
	in := t.Input()
	in.Truncated = in.Truncated || more
	in.Body = body
	in.Watch = (*connWatch)(ctx)
	// The Lua's first call (contract.HdrDeferPD): a prefill/decode request is
	// decided on its second call, through the hop whose timeout covers
	// the prefill, so this one never waits on a prefill.
	if a.d.Prefills(in) && len(ctx.Request.Header.Peek(contract.HdrDeferPD)) > 0 {
		ctx.Response.Header.Set(contract.HdrPD, "1")
		ctx.SetStatusCode(fasthttp.StatusOK)
		return
	}
	a.writeHTTP(ctx, a.d.DecideTxn(t), t)
}

// writeHTTP writes a Verdict as the HTTP answer of route/contract.
func (a *API) writeHTTP(ctx *fasthttp.RequestCtx, v *contract.Verdict, t *route.Txn) {
	h := &ctx.Response.Header
	if !v.Routed() {
		if v.RetryAfter {
			h.Set(contract.HdrRetryAfter, contract.RetryAfterSeconds)
		}
		h.Set(contract.HdrReason, v.Reason)
		ctx.SetStatusCode(v.Status)
		ctx.SetContentType("application/json")
		ctx.SetBody(v.Body)
		return
	}
	fields := contract.RoutedFields()
	want := t.Input().Want
	for i := range fields {
		f := &fields[i]
		if f.Header == "" || f.Asked && !contract.Wants(want, f.Name) {
			continue
		}
		if b := f.Value(v); len(b) > 0 {
			h.SetCanonical(a.hdrs[i], b)
		}
	}
	buf := t.Buf.Out[:0]
	for i, f := range v.Fallbacks {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, f...)
	}
	h.SetCanonical(hdrFallbacksB, buf)
	t.Buf.Out = buf
	if len(v.KVInsert) > 0 && v.KVAt >= 0 {
		// PD only, after a prefill round trip: allocating here is fine.
		// The edit carries kv_transfer_params: one copy in the headers.
		h.Set(contract.HdrKVInsert, base64.StdEncoding.EncodeToString(v.KVInsert))
		h.Set(contract.HdrKVAt, strconv.Itoa(v.KVAt))
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// done closes a decision (GET/POST /internal/done?id=[&tft=ms]).
func (a *API) done(ctx *fasthttp.RequestCtx) {
	if !a.doneAllowed(ctx) {
		a.refuse(ctx, fasthttp.StatusForbidden, "permission_error", "forbidden",
			"completions are accepted from feedback.sources only, with "+contract.HdrToken+" when feedback.token is set")
		return
	}
	id, ok := contract.ParseDecisionID(ctx.QueryArgs().Peek("id"))
	if !ok {
		a.refuse(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "bad_id", "id must be a decision id from "+contract.HdrDecision)
		return
	}
	// Custom glue may say when the first response body bytes came (the
	// feedback line's tft=, in ms since the request reached the proxy).
	c := route.NoCompletion()
	if v := ctx.QueryArgs().Peek(contract.FeedbackFieldFirstToken); v != nil {
		ms, err := fasthttp.ParseUint(v)
		if err != nil {
			a.refuse(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "bad_first_token",
				contract.FeedbackFieldFirstToken+" must be the milliseconds from the request's arrival to the first response body bytes")
			return
		}
		c.FirstTokenMs, c.HasFirstToken = int64(ms), true
	}
	st := a.d.Ledger().CloseDecisionWith(id, c)
	if st == nil {
		a.refuse(ctx, fasthttp.StatusNotFound, "invalid_request_error", "unknown_decision", "unknown or already completed decision")
		return
	}
	if c.HasFirstToken {
		st.ObserveFirstToken(c.FirstTokenMs)
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// doneAllowed guards contract.PathDone like the UDP listener: the caller's address
// must be in feedback.sources and, with a token, carry it.
func (a *API) doneAllowed(ctx *fasthttp.RequestCtx) bool {
	snap := a.d.Snapshot()
	ip, ok := netip.AddrFromSlice(ctx.RemoteIP())
	if !ok || !snap.FeedbackAllowed(ip) {
		return false
	}
	tok := snap.DoneToken()
	return len(tok) == 0 || subtle.ConstantTimeCompare(ctx.Request.Header.Peek(contract.HdrToken), tok) == 1
}

// metrics answers /metrics.
func (a *API) metrics(ctx *fasthttp.RequestCtx) {
	var b strings.Builder
	a.d.WriteMetrics(&b)
	ctx.SetContentType("text/plain; version=0.0.4")
	ctx.SetBodyString(b.String())
}

// writeError answers with an OpenAI-style JSON error. Errors are rare, so
// encoding/json's allocations are fine here.
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	b := contract.ErrorBody(typ, code, msg)
	ctx.Response.Header.Set(contract.HdrReason, code)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// OverloadedAnswer is the raw HTTP answer to a connection over
// limits.max_conns (internal/netlimit writes it): a 503 with the overloaded
// reason, so the proxy glue applies its fail mode without counting a dead
// turnout, which fasthttp's own Concurrency limit (plain text, no reason)
// would not let it do.
func OverloadedAnswer() []byte {
	body := contract.ErrorBody("service_unavailable", contract.ReasonOverloaded, "too many connections to turnout")
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n" + contract.HdrReason + ": " + contract.ReasonOverloaded +
		"\r\n" + contract.HdrRetryAfter + ": " + contract.RetryAfterSeconds + "\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
}

// ErrorHandler answers fasthttp-level errors (oversized or malformed
// requests) in JSON. fasthttp's own error text never reaches the client
// (the proxies would relay it); each answer carries an X-Turnout-Reason the
// glue knows: a request turnout could not read (431, 408) makes the proxy
// apply its fail mode rather than refuse the client.
func ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", contract.ReasonBodyTooLarge, "request body too large")
	case errors.As(err, &small):
		writeError(ctx, contract.StatusHeaderTooLarge, "invalid_request_error", contract.ReasonHeaderTooLarge,
			"request headers larger than turnout's limits.max_header_bytes")
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		writeError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", contract.ReasonReadTimeout, "the request was not received in time")
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", contract.ReasonBadRequest, "malformed HTTP request")
	}
}

// NewHTTPServer returns a fasthttp server tuned for the route endpoint,
// bounded by the snapshot's limits (a change of those needs a new server:
// cmd/turnout reopens the listener).
func (a *API) NewHTTPServer() *fasthttp.Server {
	return a.NewHTTPServerFor(a.d.Snapshot().Config)
}

// NewHTTPServerFor is NewHTTPServer with the limits of cfg, a config about
// to be applied. max_body and the body limits are read per request from the
// live snapshot; the connection-level limits (HTTPServerKey) are fixed here.
func (a *API) NewHTTPServerFor(cfg *config.Config) *fasthttp.Server {
	lim := &cfg.Limits
	return &fasthttp.Server{
		Handler:               a.Handler,
		ErrorHandler:          a.errorHandler,
		Name:                  "turnout",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		// turnout reads bodies itself (body.go): only what arrived,
		// up to max_body, within the shared budget.
		StreamRequestBody: true,
		// fasthttp only pre-reads with it; readBody applies the live max_body.
		MaxRequestBodySize: hardBodyLimit(maxMaxBody),
		// The request head must fit one read buffer.
		ReadBufferSize: lim.MaxHeaderBytes,
		// limits.max_conns is internal/netlimit's (OverloadedAnswer, which the glue understands).
		ReadTimeout:  lim.ReadTimeout.D(),
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  5 * time.Minute,
		// Return per-connection buffers of idle keep-alive connections.
		ReduceMemoryUsage: true,
		Logger:            fasthttpLogger{a.d.Log()},
	}
}

// HTTPServerKey names the settings NewHTTPServerFor (and the connection limit) fix for the life of
// a server, by config field: a change of any needs a new server.
func HTTPServerKey(cfg *config.Config) map[string]string {
	l := &cfg.Limits
	return map[string]string{
		"listen":                  cfg.Listen,
		"limits.max_conns":        strconv.Itoa(l.MaxConns),
		"limits.max_header_bytes": strconv.Itoa(l.MaxHeaderBytes),
		"limits.read_timeout":     l.ReadTimeout.D().String(),
	}
}

type fasthttpLogger struct{ l *zerolog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) { f.l.Debug().Msgf(format, args...) }

// ready answers /readyz: 200 or 503 with a one-line reason, and with
// ?verbose one line per pool.
func (a *API) ready(ctx *fasthttp.RequestCtx) {
	var b strings.Builder
	verbose := ctx.QueryArgs().Has("verbose")
	ok := a.d.WriteReadiness(&b, verbose)
	if verbose {
		// Completion feedback and degraded endpoints: never the status.
		a.d.Extras().WriteReadinessNotes(&b)
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	if ok {
		ctx.SetStatusCode(fasthttp.StatusOK)
	} else {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	ctx.SetBodyString(b.String())
}

// refuse writes an error answer of turnout's own and counts it
// (turnout_refusals_total, logged rate-limited).
func (a *API) refuse(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	writeError(ctx, status, typ, code, msg)
	a.d.Refusals().NoteRefusal(status, code, msg)
}

// errorHandler is ErrorHandler, counted like every refusal.
func (a *API) errorHandler(ctx *fasthttp.RequestCtx, err error) {
	ErrorHandler(ctx, err)
	a.d.Refusals().NoteRefusal(ctx.Response.StatusCode(), string(ctx.Response.Header.Peek(contract.HdrReason)), err.Error())
}
