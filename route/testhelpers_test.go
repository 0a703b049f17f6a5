package route

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/internal/config"

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

func mustServer(t testing.TB, y string) *Server {
	t.Helper()
	s, err := NewServer(mustConfig(t, y), Options{Seed: 42})
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	return s
}

// do sends one /internal/route request through the handler.
func do(s *Server, body string, hdrs ...string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(PathRoute)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.DisableNormalizing()
	for i := 0; i+1 < len(hdrs); i += 2 {
		ctx.Request.Header.Set(hdrs[i], hdrs[i+1])
	}
	ctx.Request.SetBodyString(body)
	s.Handler(&ctx)
	return &ctx
}

func hdr(ctx *fasthttp.RequestCtx, k string) string { return string(ctx.Response.Header.Peek(k)) }

// chatBody builds a chat request with a system prompt and a user message.
func chatBody(model, system, user string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"stream":true}`, model, system, user)
}

const fourEndpoints = `
session_headers: [x-session-id, x-user]
health: {disable: true}
deployments:
  - name: llama
    models: [llama, meta-llama/Llama-3.1-8B-Instruct]
    policy: {name: %s}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
          - {name: c, address: 127.0.0.1:8003}
          - {name: d, address: 127.0.0.1:8004}
`
