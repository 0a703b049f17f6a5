package httpapi

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
)

// GET /internal/decision/<id> on the main handler: 200 with the record's
// fields for a decision just made, 404 for an unknown id, 400 for a bad
// one; the admin listener never serves it.
func TestDecisionLookup(t *testing.T) {
	s := mustServer(t, strings.Replace(fourEndpoints, "%s", "round-robin", 1))
	ctx := do(s, chatBody("llama", "", "hi"), "X-Session-Id", "u1")
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("route: %d", ctx.Response.StatusCode())
	}
	id, srv := hdr(ctx, contract.HdrDecision), hdr(ctx, contract.HdrServer)
	get := func(h func(*fasthttp.RequestCtx), path string) (int, []byte) {
		var req fasthttp.Request
		req.SetRequestURI(path)
		req.Header.SetMethod("GET")
		var c fasthttp.RequestCtx
		c.Init(&req, &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 40000}, nil)
		h(&c)
		return c.Response.StatusCode(), c.Response.Body()
	}
	code, body := get(s.Handler, PathDecision+id)
	var m map[string]any
	if code != 200 || json.Unmarshal(body, &m) != nil {
		t.Fatalf("lookup: %d %s", code, body)
	}
	for k, v := range map[string]any{"decision": id, "endpoint": srv, "deployment": "llama", "model": "llama",
		"pool": "llama_mixed", "state": "open", "session": true, "status": -1.0} {
		if m[k] != v {
			t.Errorf("%s = %v, want %v (%s)", k, m[k], v, body)
		}
	}
	if code, _ := get(s.Handler, PathDecision+"0123456789abcdef"); code != 404 {
		t.Errorf("unknown id: %d, want 404", code)
	}
	if code, _ := get(s.Handler, PathDecision+"xyz"); code != 400 {
		t.Errorf("bad id: %d, want 400", code)
	}
	// Only feedback.sources may ask (loopback by default).
	var req fasthttp.Request
	req.SetRequestURI(PathDecision + id)
	var c fasthttp.RequestCtx
	c.Init(&req, &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 40000}, nil)
	s.Handler(&c)
	if c.Response.StatusCode() != 403 {
		t.Errorf("lookup from 10.1.2.3: %d, want 403", c.Response.StatusCode())
	}
	if code, body := get(s.AdminHandler, PathDecision+id); code != 404 || !strings.Contains(string(body), "admin listener") {
		t.Errorf("admin listener served the lookup: %d %s", code, body)
	}
}
