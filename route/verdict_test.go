package route

import (
	"encoding/json"
	"fmt"
	"testing"
)

// The body edit turnout sends the glue must rebuild exactly DecodeBody,
// which the Lua, njs and SPOE paths are held to.
func TestBodyEditMatchesDecodeBody(t *testing.T) {
	kv := `{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":5}`
	for _, body := range []string{
		`{"model":"m","stream":true}`,
		` { } `,
		"\n{\"messages\":[{\"content\":\"日本語 \\\"q\\\"\"}],\"n\":1e3}",
		`{"a":{"b":{}}}`,
	} {
		ins, at := BodyEdit([]byte(body), []byte(kv), nil)
		if at < 0 {
			t.Fatalf("%q: refused", body)
		}
		got := body[:at] + string(ins) + body[at:]
		want, err := DecodeBody([]byte(body), []byte(kv))
		if err != nil || got != string(want) {
			t.Fatalf("body %q:\n got %s\nwant %s (%v)", body, got, want, err)
		}
	}
	for _, bad := range []string{``, `[1]`, `x{}`} {
		if _, at := BodyEdit([]byte(bad), []byte(kv), nil); at >= 0 {
			t.Fatalf("body %q accepted", bad)
		}
	}
}

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
	var in Input
	in.URI = []byte("/v1/chat/completions")
	in.AddHeader([]byte("X-Session-Id"), []byte("user-9"))
	in.Body = []byte(body)
	var v Verdict
	s.Decide(&in, &v)
	if !v.Routed() {
		t.Fatalf("not routed: %d %s %s", v.Status, v.Reason, v.Body)
	}
	h := &ctx.Response.Header
	if string(v.Server) != string(h.Peek(HdrServer)) || string(v.Addr) != string(h.Peek(HdrBackend)) ||
		string(v.Pool) != string(h.Peek(HdrPool)) {
		t.Fatalf("verdict %s %s %s, handler %s %s %s", v.Server, v.Addr, v.Pool,
			h.Peek(HdrServer), h.Peek(HdrBackend), h.Peek(HdrPool))
	}
	fb := ""
	for i, f := range v.Fallbacks {
		if i > 0 {
			fb += ","
		}
		fb += string(f)
	}
	if fb == "" || fb != string(h.Peek(HdrFallbacks)) {
		t.Fatalf("fallbacks %q, handler %q", fb, h.Peek(HdrFallbacks))
	}
	if len(v.DecisionHex()) != 16 || string(v.DecisionHex()) == string(h.Peek(HdrDecision)) {
		t.Fatalf("decision %s (handler's %s): want a fresh 16-digit id", v.DecisionHex(), h.Peek(HdrDecision))
	}

	// A refusal carries status, reason and an OpenAI-style body.
	in.Body = []byte(`{"model":"nope"}`)
	s.Decide(&in, &v)
	if v.Status != 404 || v.Reason != "model_not_found" || len(v.Fallbacks) != 0 || v.Server != nil ||
		!jsonHasCode(v.Body, "model_not_found") {
		t.Fatalf("refusal: %+v", v)
	}
}

// A warm Decide allocates nothing (the SPOE agent calls it directly).
func TestDecideAllocs(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	var in Input
	in.AddHeader([]byte("x-session-id"), []byte("u"))
	in.Body = []byte(body4K(1))
	var v Verdict
	run := func() {
		s.Decide(&in, &v)
		if !v.Routed() {
			t.Fatalf("status %d", v.Status)
		}
		s.Complete(v.Decision)
	}
	for range 100 {
		run()
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("%v allocations per decision", n)
	}
}

func jsonHasCode(b []byte, code string) bool {
	var e apiError
	return json.Unmarshal(b, &e) == nil && e.Error.Code == code
}
