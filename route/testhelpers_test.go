package route

import (
	"encoding/base64"
	"strconv"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"

	"github.com/valyala/fasthttp"
)

func mustConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	c, err := config.ParseConfig([]byte(y))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

func mustServer(t testing.TB, y string) *Decider {
	t.Helper()
	s, err := New(mustConfig(t, y), Options{Seed: 42})
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	return s
}

// do decides one request through handle.
func do(s *Decider, body string, hdrs ...string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.DisableNormalizing()
	for i := 0; i+1 < len(hdrs); i += 2 {
		ctx.Request.Header.Set(hdrs[i], hdrs[i+1])
	}
	ctx.Request.SetBodyString(body)
	handle(s, &ctx)
	return &ctx
}

// handle decides the POST /internal/route call in ctx as the HTTP transport
// does (route/httpapi reads it the same way: ProxyHeaders,
// the body cut at max_body) and writes the Verdict into ctx's response
// like it: status, X-Turnout-* headers or the error answer. route cannot
// import httpapi; httpapi's tests check its own reading and encoding.
// Allocation-free like the transport (the PD body edit aside).
func handle(s *Decider, ctx *fasthttp.RequestCtx) {
	t := s.Begin()
	defer s.End(t)
	t.ProxyHeaders(&ctx.Request.Header)
	in := t.Input()
	in.Body = ctx.PostBody()
	if max := t.Config().MaxBody; len(in.Body) > max {
		in.Body, in.Truncated = in.Body[:max], true
	}
	v := s.DecideTxn(t)
	h := &ctx.Response.Header
	ctx.SetStatusCode(v.Status)
	if !v.Routed() {
		if v.RetryAfter {
			h.Set(contract.HdrRetryAfter, contract.RetryAfterSeconds)
		}
		h.Set(contract.HdrReason, v.Reason)
		ctx.SetContentType("application/json")
		ctx.SetBody(v.Body)
		return
	}
	fields := contract.RoutedFields()
	for i := range fields {
		if b := fields[i].Value(v); fields[i].Header != "" && len(b) > 0 {
			h.SetBytesV(fields[i].Header, b)
		}
	}
	buf := t.Buf.Out[:0]
	for i, f := range v.Fallbacks {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, f...)
	}
	h.SetBytesV(contract.HdrFallbacks, buf)
	t.Buf.Out = buf
	if len(v.KVInsert) > 0 && v.KVAt >= 0 {
		h.Set(contract.HdrKVInsert, base64.StdEncoding.EncodeToString(v.KVInsert))
		h.Set(contract.HdrKVAt, strconv.Itoa(v.KVAt))
	}
}

func hdr(ctx *fasthttp.RequestCtx, k string) string { return string(ctx.Response.Header.Peek(k)) }

var chatBody = routetest.ChatBody

const fourEndpoints = routetest.FourEndpoints
