package route

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// twoDeployments is fourEndpoints plus a second deployment, "other": the
// model then picks the pool.
const twoDeployments = fourEndpoints + `
  - name: other
    models: [other]
    pools: [{role: mixed, endpoints: [{name: o, address: 127.0.0.1:8005}]}]
`

// Issue 28 item 5: where the model picks the deployment, a body with two
// "model" keys is refused (400, OpenAI error, reason duplicate_model)
// rather than routed on the first while vLLM serves the last; one "model"
// routes as before. With one deployment every name reaches the same
// replicas, so the body is routed and the replica reads it as vLLM does.
func TestDuplicateModelRefused(t *testing.T) {
	one := mustServer(t, fmt.Sprintf(fourEndpoints, "round-robin"))
	if ctx := do(one, `{"model":"llama","messages":[],"model":"other"}`); ctx.Response.StatusCode() != 200 {
		t.Fatalf("one deployment: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	// One deployment reads the body as vLLM does, the last key: a first
	// name it does not serve is not its 404.
	if ctx := do(one, `{"model":"nope","messages":[],"model":"llama"}`); ctx.Response.StatusCode() != 200 {
		t.Fatalf("one deployment, last key served: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if ctx := do(one, `{"model":"nope","messages":[],"model":"nope2"}`); ctx.Response.StatusCode() != 404 || !strings.Contains(string(ctx.Response.Body()), "nope2") {
		t.Fatalf("one deployment, neither served: %d %s, want 404 naming the last", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	s := mustServer(t, fmt.Sprintf(twoDeployments, "round-robin"))
	for _, body := range []string{
		`{"model":"llama","messages":[{"role":"user","content":"hi"}],"model":"other"}`,
		`{"model":"llama","mod\u0065l":"other","messages":[]}`,
	} {
		ctx := do(s, body)
		if ctx.Response.StatusCode() != 400 || hdr(ctx, contract.HdrReason) != contract.ReasonDuplicateModel {
			t.Fatalf("%s: %d %q, want 400 %s", body, ctx.Response.StatusCode(), hdr(ctx, contract.HdrReason), contract.ReasonDuplicateModel)
		}
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		if err := json.Unmarshal(ctx.Response.Body(), &e); err != nil || e.Error.Type != "invalid_request_error" || e.Error.Code != contract.ReasonDuplicateModel || e.Error.Message == "" {
			t.Fatalf("%s: error body %s (%v)", body, ctx.Response.Body(), err)
		}
	}
	if ctx := do(s, `{"model":"llama","messages":[{"role":"user","content":"the \"model\" key"}]}`); ctx.Response.StatusCode() != 200 {
		t.Fatalf("one model: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
}

// With adapters in the table, a base model's first key does not hide the
// last: vLLM reads the last, so the request goes where that adapter is
// (or gets turnout's 404), not to a replica that would answer 404.
func TestDuplicateModelAdapterLast(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "round-robin"))
	defer s.Close()
	for _, n := range []string{"a", "b", "c", "d"} {
		setServed(s, n, base("llama"))
	}
	if ctx := do(s, `{"model":"llama","messages":[],"model":"other"}`); ctx.Response.StatusCode() != 200 {
		t.Fatalf("no adapter, base model first: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	setServed(s, "c", base("llama"), lora("sql"))
	for i := range 8 {
		ctx := do(s, fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"q%d"}],"model":"sql"}`, i))
		if ctx.Response.StatusCode() != 200 || hdr(ctx, contract.HdrServer) != "c" {
			t.Fatalf("base first, adapter last: %d to %q, want c (the adapter's)", ctx.Response.StatusCode(), hdr(ctx, contract.HdrServer))
		}
	}
	if ctx := do(s, `{"model":"llama","messages":[],"model":"nope"}`); ctx.Response.StatusCode() != 404 || !strings.Contains(string(ctx.Response.Body()), "nope") {
		t.Fatalf("base first, unknown last, adapters served: %d %s, want 404 naming the last", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if ctx := do(s, `{"model":"llama","messages":[]}`); ctx.Response.StatusCode() != 200 {
		t.Fatalf("one model key: %d", ctx.Response.StatusCode())
	}
}
