package httpapi

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
)

func TestSessionHeaderMatrix(t *testing.T) {
	for _, pol := range []string{"session-hash", "prefix-affinity"} {
		t.Run(pol, func(t *testing.T) { testSessionHeaderMatrix(t, pol) })
	}
}

func testSessionHeaderMatrix(t *testing.T, pol string) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, pol))
	first := do(s, chatBody("llama", "", "hi"), "X-Session-ID", "abc")
	home := hdr(first, contract.HdrServer)
	// Completed, so every replica is idle again: prefix-affinity's session
	// only breaks load ties.
	if id, _ := contract.ParseDecisionID([]byte(hdr(first, contract.HdrDecision))); !s.Ledger().Complete(id) {
		t.Fatal("decision id not completable")
	}
	for _, tc := range []struct {
		name    string
		hdrs    []string
		sameAs  bool // must land on home
		session bool // must be treated as a session
	}{
		{"canonical", []string{"X-Session-ID", "abc"}, true, true},
		{"lower underscore", []string{"x_session_id", "abc"}, true, true},
		{"mixed", []string{"X_SESSION-id", "abc"}, true, true},
		{"mixed 2", []string{"X_Session-Id", "abc"}, true, true},
		{"second configured name", []string{"X-USER", "abc"}, true, true},
		{"second name underscore", []string{"x_user", "abc"}, true, true},
		{"empty value is no session", []string{"X-Session-ID", ""}, false, false},
		{"unrelated header", []string{"X-Session", "abc"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 20; i++ {
				ctx := do(s, chatBody("llama", "", "hi"), tc.hdrs...)
				if ctx.Response.StatusCode() != 200 {
					t.Fatalf("status %d", ctx.Response.StatusCode())
				}
				if tc.sameAs && hdr(ctx, contract.HdrServer) != home {
					t.Fatalf("landed on %s, session home %s", hdr(ctx, contract.HdrServer), home)
				}
				if id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision))); !s.Ledger().Complete(id) {
					t.Fatal("decision id not completable")
				}
			}
			snap := s.Snapshot()
			aff := snap.Deployments[0].Serve.Metrics.Outcomes[fleet.OutcomeAffinity].Load()
			ctx := do(s, chatBody("llama", "", "hi"), tc.hdrs...)
			got := snap.Deployments[0].Serve.Metrics.Outcomes[fleet.OutcomeAffinity].Load() - aff
			if tc.session != (got == 1) {
				t.Fatalf("session treatment = %v, want %v", got == 1, tc.session)
			}
			id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
			s.Ledger().Complete(id)
		})
	}
}

func TestRouteContract(t *testing.T) {
	single := mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	multi := mustServer(t, `
health: {disable: true}
deployments:
  - name: a
    models: [model-a]
    pools: [{role: mixed, endpoints: [{name: a0, address: 127.0.0.1:9001}]}]
  - name: b
    models: [model-b]
    pools: [{role: mixed, endpoints: [{name: b0, address: 127.0.0.1:9002}]}]
`)
	for _, tc := range []struct {
		name   string
		s      *testServer
		body   string
		hdrs   []string
		status int
		code   string
		server string
	}{
		{"chat routed", single, chatBody("llama", "sys", "hi"), nil, 200, "", "*"},
		{"alias model", single, chatBody("meta-llama/Llama-3.1-8B-Instruct", "", "hi"), nil, 200, "", "*"},
		{"escaped slash in model", single, `{"model":"meta-llama\/Llama-3.1-8B-Instruct","prompt":"x"}`, nil, 200, "", "*"},
		{"unknown model", single, chatBody("gpt-9", "", "hi"), nil, 404, "model_not_found", ""},
		{"garbage json balanced", single, `{{{ not json`, nil, 200, "", "*"},
		{"empty body balanced", single, ``, nil, 200, "", "*"},
		{"no model, one deployment", single, `{"prompt":"x"}`, nil, 200, "", "*"},
		{"no model, several deployments", multi, `{"prompt":"x"}`, nil, 400, "model_required", ""},
		{"model header", multi, `{"prompt":"x"}`, []string{"X-Model", "model-b"}, 200, "", "b0"},
		{"body model wins", multi, `{"model":"model-a"}`, []string{"x_model", "model-b"}, 200, "", "a0"},
		{"model b", multi, `{"model":"model-b"}`, nil, 200, "", "b0"},
		{"truncated body still routes", single, `{"model":"llama","messages":[{"role":"user","content":"abc`, []string{contract.HdrBodyTruncated, "40/9000"}, 200, "", "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := do(tc.s, tc.body, tc.hdrs...)
			if got := ctx.Response.StatusCode(); got != tc.status {
				t.Fatalf("status %d, want %d: %s", got, tc.status, ctx.Response.Body())
			}
			if tc.code != "" {
				if e := routetest.ErrBody(t, ctx.Response.Body()); e.Code != tc.code {
					t.Fatalf("code %s, want %s", e.Code, tc.code)
				}
				return
			}
			srv := hdr(ctx, contract.HdrServer)
			if (tc.server == "*" && srv == "") || (tc.server != "*" && srv != tc.server) {
				t.Fatalf("server %q, want %q", srv, tc.server)
			}
			if hdr(ctx, contract.HdrBackend) == "" || !strings.HasSuffix(hdr(ctx, contract.HdrPool), "_mixed") || len(hdr(ctx, contract.HdrDecision)) != 16 {
				t.Fatalf("incomplete verdict: %s", ctx.Response.Header.String())
			}
		})
	}
}

func TestFallbacksDistinct(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	ctx := do(s, chatBody("llama", "", "x"))
	fb := strings.Split(hdr(ctx, contract.HdrFallbacks), ",")
	seen := map[string]bool{hdr(ctx, contract.HdrServer): true}
	for _, f := range fb {
		if seen[f] || f == "" {
			t.Fatalf("fallbacks %v repeat or are empty (server %s)", fb, hdr(ctx, contract.HdrServer))
		}
		seen[f] = true
	}
	if len(fb) != 2 {
		t.Fatalf("want 2 fallbacks by default, got %v", fb)
	}
}

func TestNoEndpoint503(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "round-robin"))
	for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
		e.SetDown(true)
	}
	ctx := do(s, chatBody("llama", "", "x"))
	if ctx.Response.StatusCode() != 503 || hdr(ctx, "Retry-After") == "" {
		t.Fatalf("status %d retry-after %q", ctx.Response.StatusCode(), hdr(ctx, "Retry-After"))
	}
	routetest.ErrBody(t, ctx.Response.Body())
}

func TestMethodAndPath(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "round-robin"))
	ctx := do(s, "")
	ctx.Request.Header.SetMethod("GET")
	ctx.Response.Reset()
	s.Handler(ctx)
	if ctx.Response.StatusCode() != 405 {
		t.Fatalf("GET route: %d", ctx.Response.StatusCode())
	}
	ctx.Request.SetRequestURI("/nope")
	ctx.Response.Reset()
	s.Handler(ctx)
	if ctx.Response.StatusCode() != 404 {
		t.Fatalf("unknown path: %d", ctx.Response.StatusCode())
	}
	routetest.ErrBody(t, ctx.Response.Body())
}

func TestReloadKeepsState(t *testing.T) {
	y := fmt.Sprintf(fourEndpoints, "prefix-affinity")
	s := mustServer(t, y)
	sys := strings.Repeat("shared system prompt ", 100)
	home := hdr(do(s, chatBody("llama", sys, "q1")), contract.HdrServer)
	// Drop endpoint "d" unless it is home; keep home.
	drop := "d"
	if home == "d" {
		drop = "c"
	}
	y2 := strings.Replace(y, fmt.Sprintf("          - {name: %s, address: 127.0.0.1:800%d}\n", drop, map[string]int{"c": 3, "d": 4}[drop]), "", 1)
	if y2 == y {
		t.Fatal("test bug: endpoint not removed")
	}
	if err := s.Apply(routetest.MustConfig(t, y2)); err != nil {
		t.Fatal(err)
	}
	var homeEp *fleet.Endpoint
	for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
		if e.Name == drop {
			t.Fatalf("%s still present", drop)
		}
		if e.Name == home {
			homeEp = e
		}
	}
	if homeEp.Inflight() != 1 {
		t.Fatalf("in-flight lost across reload: %d", homeEp.Inflight())
	}
	if got := hdr(do(s, chatBody("llama", sys, "q2")), contract.HdrServer); got != home {
		t.Fatalf("prefix index lost across reload: %s, want %s", got, home)
	}
	// A bad config is rejected and the old snapshot stays.
	before := s.Snapshot()
	if err := s.Apply(&config.Config{}); err == nil {
		t.Fatal("empty config accepted")
	}
	if s.Snapshot() != before {
		t.Fatal("snapshot changed after a rejected config")
	}
}

// Prefix routing end to end through the handler: a shared system prompt
// sticks; distinct prompts spread.
func TestHandlerPrefixRouting(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	sys := strings.Repeat("You are a very careful assistant. ", 30)
	home := ""
	for i := 0; i < 20; i++ {
		ctx := do(s, chatBody("llama", sys, fmt.Sprintf("question %d", i)))
		if home == "" {
			home = hdr(ctx, contract.HdrServer)
		} else if hdr(ctx, contract.HdrServer) != home {
			t.Fatalf("request %d went to %s, prefix home %s", i, hdr(ctx, contract.HdrServer), home)
		}
		id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
		s.Ledger().Complete(id)
	}
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		ctx := do(s, chatBody("llama", fmt.Sprintf("%d distinct system prompt %s", i, strings.Repeat("x", 300)), "q"))
		seen[hdr(ctx, contract.HdrServer)] = true
		id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
		s.Ledger().Complete(id)
	}
	if len(seen) != 4 {
		t.Fatalf("distinct prompts used only %d endpoints", len(seen))
	}
}

// The proxy's call to turnout must outlast a PD decision (prefill + retry).
func TestRouteCallTimeout(t *testing.T) {
	plain := routetest.MustConfig(t, "proxy: {route_timeout: 300ms}\ndeployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]")
	if got := plain.RouteCallTimeout(); got != 300*time.Millisecond {
		t.Fatalf("plain: %v", got)
	}
	pd := routetest.MustConfig(t, "proxy: {route_timeout: 300ms}\ndeployments: [{name: a, pd: {prefill_timeout: 10s}, pools: [{role: prefill, endpoints: [{name: p, address: 1.2.3.4:5}]}, {role: decode, endpoints: [{name: d, address: 1.2.3.4:6}]}]}]")
	if got := pd.RouteCallTimeout(); got != 21*time.Second {
		t.Fatalf("pd: %v, want 2 x prefill_timeout + 1s", got)
	}
}

// The Lua's first call (contract.HdrDeferPD) is answered at once for a
// prefill/decode request, with contract.HdrPD and no verdict, whatever the
// prefill would take; other requests are decided on it; a call without the
// header (the second, or an older glue) gets the whole decision.
func TestDeferPrefillDecode(t *testing.T) {
	s := mustServer(t, `
proxy: {route_timeout: 300ms}
deployments:
  - {name: pd, models: [pd], pd: {prefill_timeout: 200ms}, pools: [{role: prefill, endpoints: [{name: p, address: "127.0.0.1:9"}]}, {role: decode, endpoints: [{name: d, address: "127.0.0.1:10"}]}]}
  - {name: mx, models: [mx], pools: [{endpoints: [{name: m, address: "127.0.0.1:11"}]}]}
`)
	start := time.Now()
	ctx := do(s, chatBody("pd", "s", "hi"), contract.HdrDeferPD, "1")
	if ctx.Response.StatusCode() != 200 || hdr(ctx, contract.HdrPD) != "1" || hdr(ctx, contract.HdrServer) != "" || hdr(ctx, contract.HdrDecision) != "" {
		t.Fatalf("deferred PD call: %d pd=%q server=%q", ctx.Response.StatusCode(), hdr(ctx, contract.HdrPD), hdr(ctx, contract.HdrServer))
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("the deferred call took %v: it ran the prefill", took)
	}
	ctx = do(s, chatBody("mx", "s", "hi"), contract.HdrDeferPD, "1")
	if hdr(ctx, contract.HdrServer) != "m" || hdr(ctx, contract.HdrPD) != "" {
		t.Fatalf("mixed request with the header: server %q pd %q", hdr(ctx, contract.HdrServer), hdr(ctx, contract.HdrPD))
	}
	// Nothing listens at the prefill address: the whole decision ran it.
	ctx = do(s, chatBody("pd", "s", "hi"))
	if hdr(ctx, contract.HdrPD) != "" || hdr(ctx, contract.HdrReason) != contract.ReasonPrefillFailed {
		t.Fatalf("second call: %d pd=%q reason %q, want the prefill tried", ctx.Response.StatusCode(), hdr(ctx, contract.HdrPD), hdr(ctx, contract.HdrReason))
	}
}

// An asked field (X-Turnout-Fallback-Backend) is answered only to a call
// that names it in X-Turnout-Want, in any spelling and list position; the
// other fields are answered either way.
func TestAskedFields(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	pool := s.Snapshot().Deployments[0].Serve
	for _, tc := range []struct {
		name string
		hdrs []string
		want bool
	}{
		{"not asked", nil, false},
		{"another field", []string{contract.HdrWant, "addr"}, false},
		{"a prefix of the name", []string{contract.HdrWant, "fallback"}, false},
		{"asked", []string{contract.HdrWant, "fallback_addr"}, true},
		{"in a list, other spelling", []string{"x_turnout_want", "pool, fallback_addr"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := do(s, chatBody("llama", "", "x"), tc.hdrs...)
			if ctx.Response.StatusCode() != 200 || hdr(ctx, contract.HdrServer) == "" || hdr(ctx, contract.HdrBackend) == "" {
				t.Fatalf("verdict %d: %s", ctx.Response.StatusCode(), ctx.Response.Header.String())
			}
			got := hdr(ctx, contract.HdrFallbackBackend)
			if !tc.want {
				if got != "" {
					t.Fatalf("%s %q answered unasked", contract.HdrFallbackBackend, got)
				}
				return
			}
			first, _, _ := strings.Cut(hdr(ctx, contract.HdrFallbacks), ",")
			e := pool.EndpointByName([]byte(first))
			if e == nil || got != e.Address {
				t.Fatalf("%s %q, want the address of the first fallback %q (%v)", contract.HdrFallbackBackend, got, first, e)
			}
		})
	}
}
