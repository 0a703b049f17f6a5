package httpapi

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
)

// Decide is the entry point both transports use: the HTTP handler's
// answer and a direct Decide of the same Input agree, field by field.
func TestDecideMatchesHandler(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "session-hash"))
	body := body4K(3)
	ctx := routeCtx(body, "user-9")
	s.Handler(ctx)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d", ctx.Response.StatusCode())
	}
	var in contract.Input
	in.URI = []byte("/v1/chat/completions")
	in.AddHeader([]byte("X-Session-Id"), []byte("user-9"))
	in.Body = []byte(body)
	var v contract.Verdict
	s.Decide(&in, &v)
	if !v.Routed() {
		t.Fatalf("not routed: %d %s %s", v.Status, v.Reason, v.Body)
	}
	h := &ctx.Response.Header
	if string(v.Server) != string(h.Peek(contract.HdrServer)) || string(v.Addr) != string(h.Peek(contract.HdrBackend)) ||
		string(v.Pool) != string(h.Peek(contract.HdrPool)) {
		t.Fatalf("verdict %s %s %s, handler %s %s %s", v.Server, v.Addr, v.Pool,
			h.Peek(contract.HdrServer), h.Peek(contract.HdrBackend), h.Peek(contract.HdrPool))
	}
	fb := ""
	for i, f := range v.Fallbacks {
		if i > 0 {
			fb += ","
		}
		fb += string(f)
	}
	if fb == "" || fb != string(h.Peek(contract.HdrFallbacks)) {
		t.Fatalf("fallbacks %q, handler %q", fb, h.Peek(contract.HdrFallbacks))
	}
	if len(v.DecisionHex()) != 16 || string(v.DecisionHex()) == string(h.Peek(contract.HdrDecision)) {
		t.Fatalf("decision %s (handler's %s): want a fresh 16-digit id", v.DecisionHex(), h.Peek(contract.HdrDecision))
	}

	// A refusal carries status, reason and an OpenAI-style body.
	in.Body = []byte(`{"model":"nope"}`)
	s.Decide(&in, &v)
	if v.Status != 404 || v.Reason != "model_not_found" || len(v.Fallbacks) != 0 || v.Server != nil ||
		!jsonHasCode(v.Body, "model_not_found") {
		t.Fatalf("refusal: %+v", v)
	}
}

func jsonHasCode(b []byte, code string) bool {
	var e struct {
		Error routetest.APIError `json:"error"`
	}
	return json.Unmarshal(b, &e) == nil && e.Error.Code == code
}
