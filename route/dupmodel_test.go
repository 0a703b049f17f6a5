package route

import (
	"encoding/json"
	"fmt"
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
