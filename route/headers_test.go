package route

import (
	"testing"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// The roles the HTTP transport tags forwarded headers with (found once per
// snapshot) must give decideInput what matching every name gives it (the
// SPOE transport's headers, untagged).
func TestHeaderRoles(t *testing.T) {
	s := mustServer(t, `
session_headers: [x-user, x_both]
model_headers: [x-model, X-Both]
health: {disable: true}
deployments:
  - name: llama
    models: [llama, alt, both]
    policy: {name: session-hash}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
`)
	snap := s.snap.Load()
	for name, want := range map[string]hdrRole{
		"X-User": hdrForwarded | hdrSession, "x_user": hdrForwarded | hdrSession,
		"X-Both": hdrForwarded | hdrSession | hdrModel, "X-Model": hdrForwarded | hdrModel,
		"Content-Type": hdrForwarded, "X-Request-Id": hdrForwarded | hdrRequestID, "X-Users": 0, "Host": 0,
	} {
		if got := snap.forwardedRole([]byte(name)); got != want {
			t.Errorf("forwardedRole(%s) = %b, want %b", name, got, want)
		}
	}
	var session, model string
	s.txns.observe = func(r *fleet.Request) { session, model = string(r.Session), string(r.Model) }
	body := `{"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		hdrs           []string
		session, model string
	}{
		{[]string{"X-User", "u1"}, "u1", ""},
		{[]string{"X-Model", "alt"}, "", "alt"},
		{[]string{"X-Both", "both"}, "both", "both"},
		{[]string{"x_model", "alt", "X_USER", "u2"}, "u2", "alt"},
		{[]string{"X-User", "u1", "X-Both", "both"}, "both", "both"},
		{[]string{"X-Request-Id", "r", "Content-Type", "application/json", "X-Users", "no"}, "", ""},
	} {
		session, model = "?", "?"
		if ctx := do(s, body, tc.hdrs...); ctx.Response.StatusCode() != 200 {
			t.Fatalf("%v: status %d: %s", tc.hdrs, ctx.Response.StatusCode(), ctx.Response.Body())
		}
		if session != tc.session || model != tc.model {
			t.Errorf("HTTP %v: session %q model %q, want %q %q", tc.hdrs, session, model, tc.session, tc.model)
		}
		session, model = "?", "?"
		in := contract.Input{Body: []byte(body)}
		for i := 0; i+1 < len(tc.hdrs); i += 2 {
			in.AddHeader([]byte(tc.hdrs[i]), []byte(tc.hdrs[i+1]))
		}
		var v contract.Verdict
		if s.Decide(&in, &v); !v.Routed() {
			t.Fatalf("%v: Decide status %d", tc.hdrs, v.Status)
		}
		if session != tc.session || model != tc.model {
			t.Errorf("Decide %v: session %q model %q, want %q %q", tc.hdrs, session, model, tc.session, tc.model)
		}
	}
}
