// Package routetest holds test helpers shared by the route packages' tests
// (pools of fake endpoints, running a policy): test support, never imported
// by shipped code.
package routetest

import (
	"encoding/json"

	"net"
	"net/http"
	"net/http/httptest"

	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Pool builds a pool of n endpoints named e0..e(n-1) with the policy.
func Pool(t testing.TB, n int, build func(p *fleet.Pool) fleet.Policy) *fleet.Pool {
	t.Helper()
	p := &fleet.Pool{Name: "d_mixed", Deployment: "d", Role: config.RoleMixed, Metrics: &fleet.PoolMetrics{}}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("e%d", i)
		p.Endpoints = append(p.Endpoints, &fleet.Endpoint{
			Name: name, Address: fmt.Sprintf("127.0.0.1:%d", 8000+i), Index: i, Seed: xxhash.Sum64String(name),
			NameHdr: []byte(name), AddrHdr: []byte(fmt.Sprintf("127.0.0.1:%d", 8000+i)), State: &fleet.State{},
		})
	}
	if build != nil {
		p.Policy = build(p)
	}
	return p
}

// Choose runs p's policy for r with room for n endpoints.
func Choose(p *fleet.Pool, r *fleet.Request, n int) *fleet.Choice {
	c := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, n)}
	p.Policy.Pick(r, p, c)
	return c
}

func Names(es []*fleet.Endpoint) string {
	var s []string
	for _, e := range es {
		s = append(s, e.Name)
	}
	return strings.Join(s, ",")
}

// MustConfig parses a YAML config or fails the test.
func MustConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	c, err := config.ParseConfig([]byte(y))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

// DeadAddr is a local address nothing listens on.
func DeadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	_ = l.Close()
	return a
}

// LiveAddr is the address of an HTTP server answering 200 to anything.
func LiveAddr(t *testing.T) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(ts.Close)
	return strings.TrimPrefix(ts.URL, "http://")
}

// ChatBody builds a chat request with a system prompt and a user message.
func ChatBody(model, system, user string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"stream":true}`, model, system, user)
}

// Body4K is a realistic ~4 KiB chat body.
func Body4K(i int) string {
	sys := strings.Repeat("You are a helpful assistant that answers precisely. ", 80)
	return ChatBody("llama", sys[:3500], fmt.Sprintf("What is the capital of country number %d?", i))
}

// FourEndpoints is a one-deployment config of four endpoints whose policy
// is the %s verb.
const FourEndpoints = `
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

// FeedbackCfg is a two-endpoint config with completion feedback: the
// syslog address, the sources and the token are its %q, %s and %q verbs.
const FeedbackCfg = `
health: {disable: true}
feedback: {syslog: %q, sources: [%s], token: %q}
deployments:
  - name: llama
    policy: {name: least-request}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
`

// APIError is the body of an OpenAI-style error, as a client reads it.
type APIError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// ErrBody decodes an OpenAI-style error body, failing the test unless it
// has a message, a type and a code.
func ErrBody(t testing.TB, b []byte) APIError {
	t.Helper()
	var e struct {
		Error APIError `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("not an OpenAI error body: %s (%v)", b, err)
	}
	return e.Error
}
