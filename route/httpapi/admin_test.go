package httpapi

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
)

// The admin listener answers health, readiness and metrics like the main
// one, and refuses the decision and completion paths.
func TestAdminHandler(t *testing.T) {
	s := mustServer(t, `
health: {disable: true}
deployments:
  - name: a
    models: [a]
    pools: [{role: mixed, endpoints: [{name: a0, address: "127.0.0.1:1"}]}]
`)
	defer s.Close()
	get := func(method, path, body string) (int, string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(method)
		ctx.Request.SetRequestURI(path)
		ctx.Request.SetBodyString(body)
		s.AdminHandler(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{contract.PathHealthz, 200, "ok"},
		{contract.PathReadyz, 200, ""},
		{contract.PathMetrics, 200, `turnout_pool_ready_endpoints{deployment="a",pool="a_mixed"} 1`},
	} {
		if code, body := get("GET", tc.path, ""); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %q, want %d containing %q", tc.path, code, body, tc.code, tc.want)
		}
	}
	for _, p := range []string{contract.PathRoute, contract.PathDone + "?id=1", "/v1/chat/completions"} {
		if code, body := get("POST", p, chatBody("a", "", "hi")); code != 404 || !strings.Contains(body, "admin listener") {
			t.Errorf("POST %s on the admin listener: %d %q, want 404", p, code, body)
		}
	}
	// The main handler still routes: the split is the admin side's alone.
	if ctx := do(s, chatBody("a", "", "hi")); ctx.Response.StatusCode() != 200 {
		t.Fatalf("main handler: %d", ctx.Response.StatusCode())
	}
}

func TestAdminListenValidation(t *testing.T) {
	base := "deployments: [{name: a, pools: [{role: mixed, endpoints: [{name: a0, address: \"127.0.0.1:1\"}]}]}]\n"
	for _, tc := range []struct{ y, err string }{
		{"admin_listen: \":9091\"\n", ""},
		{"admin_listen: 9091\n", "admin_listen"},
		{"listen: 127.0.0.1:9090\nadmin_listen: 127.0.0.1:9090\n", "admin_listen"},
	} {
		_, err := config.ParseConfig([]byte(tc.y + base))
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: err %v, want %q", tc.y, err, tc.err)
		}
	}
}
