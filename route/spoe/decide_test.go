package spoe

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"

	"github.com/valyala/fasthttp"
)

func TestSessionSpellingsLandTogether(t *testing.T) {
	a := mustAgent(t, twoDeployments)
	home := decideOnce(t, a, routeArgs("POST", "/v1/chat/completions", chatBody("llama", "hi"), "x-session-id", "abc"))[VarServer]
	if home == "" {
		t.Fatal("no server for the session")
	}
	for _, tc := range []struct {
		name string
		hdrs []string
	}{
		{"canonical", []string{"x-session-id", "abc"}},
		{"underscores", []string{"x_session_id", "abc"}},
		{"mixed case and separators", []string{"X_SESSION-id", "abc"}},
		{"second configured header", []string{"x-user", "abc"}},
		{"second header underscore", []string{"x_user", "abc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 10 {
				v := decideOnce(t, a, routeArgs("POST", "/v1/chat/completions", chatBody("llama", fmt.Sprint("q", i)), tc.hdrs...))
				if v[VarServer] != home {
					t.Fatalf("request %d landed on %q, session home %q", i, v[VarServer], home)
				}
			}
		})
	}
	// Different sessions must not all collapse onto one server.
	seen := map[string]bool{}
	for i := range 64 {
		seen[decideOnce(t, a, routeArgs("POST", "/v1/chat/completions", chatBody("llama", "hi"), "x-session-id", fmt.Sprint("s", i)))[VarServer]] = true
	}
	if len(seen) < 3 {
		t.Fatalf("64 sessions used %d servers", len(seen))
	}
}

func TestVerdictMapping(t *testing.T) {
	a := mustAgent(t, twoDeployments)
	solo := mustAgent(t, oneDeployment)
	for _, tc := range []struct {
		name  string
		agent *Agent
		args  []targ
		check func(t *testing.T, v map[string]string)
	}{
		{"body model picks the deployment", a, routeArgs("POST", "/v1/chat/completions", chatBody("qwen", "hi")),
			func(t *testing.T, v map[string]string) {
				want(t, v, VarPool, "qwen_mixed")
				if s := v[VarServer]; s != "q0" && s != "q1" {
					t.Fatalf("server %q outside qwen", s)
				}
				want(t, v, VarFallbackPrefix+"1", other(v[VarServer], "q0", "q1"))
				if len(v[VarDecision]) != 16 {
					t.Fatalf("decision id %q", v[VarDecision])
				}
				// HAProxy routes by server name: no address variable.
				absent(t, v, VarStatus, VarFallbackPrefix+"2", "addr")
			}},
		{"model header when the body has none", a, routeArgs("POST", "/v1/completions", `{"prompt":"x"}`, "x_model", "qwen"),
			func(t *testing.T, v map[string]string) { want(t, v, VarPool, "qwen_mixed") }},
		{"two fallbacks, all distinct", a, routeArgs("POST", "/v1/chat/completions", chatBody("llama", "hi"), "x-session-id", "u1"),
			func(t *testing.T, v map[string]string) {
				s, f1, f2 := v[VarServer], v[VarFallbackPrefix+"1"], v[VarFallbackPrefix+"2"]
				if s == "" || f1 == "" || f2 == "" || s == f1 || s == f2 || f1 == f2 {
					t.Fatalf("server %q fallbacks %q %q", s, f1, f2)
				}
			}},
		{"unknown model relays turnout's 404", a, routeArgs("POST", "/v1/chat/completions", chatBody("gpt-9", "hi")),
			func(t *testing.T, v map[string]string) {
				want(t, v, VarStatus, "404")
				want(t, v, VarReason, "model_not_found")
				var e struct {
					Error struct{ Code, Message string }
				}
				if err := json.Unmarshal([]byte(v[VarBody]), &e); err != nil || e.Error.Code != "model_not_found" || !strings.Contains(e.Error.Message, "gpt-9") {
					t.Fatalf("body %q (%v)", v[VarBody], err)
				}
				absent(t, v, VarServer, VarPool)
			}},
		{"no model with two deployments is a 400", a, routeArgs("POST", "/v1/completions", `{"prompt":"x"}`),
			func(t *testing.T, v map[string]string) {
				want(t, v, VarStatus, "400")
				want(t, v, VarReason, "model_required")
			}},
		{"garbage body is balanced", solo, routeArgs("POST", "/v1/chat/completions", `{{{"model": [`),
			func(t *testing.T, v map[string]string) {
				want(t, v, VarPool, "solo_mixed")
				if !strings.HasPrefix(v[VarServer], "s") {
					t.Fatalf("server %q", v[VarServer])
				}
				absent(t, v, VarStatus)
			}},
		{"empty body is balanced", solo, routeArgs("POST", "/v1/chat/completions", ``),
			func(t *testing.T, v map[string]string) { want(t, v, VarPool, "solo_mixed") }},
		{"client verdict headers are not forwarded", solo, routeArgs("POST", "/v1/x", `{}`, "x-turnout-server", "s9", "x-body-truncated", "1/2"),
			func(t *testing.T, v map[string]string) {
				if v[VarServer] == "s9" || v[VarServer] == "" {
					t.Fatalf("server %q", v[VarServer])
				}
			}},
		{"missing headers argument is not routed", solo, []targ{strArg(ArgMethod, "POST"), binArg(ArgBody, []byte(`{}`))},
			func(t *testing.T, v map[string]string) {
				want(t, v, VarStatus, "500")
				want(t, v, VarReason, reasonBadArgs)
				absent(t, v, VarServer)
			}},
		{"cut header block is not routed", solo, []targ{binArg(ArgHeaders, []byte{5, 'a'})},
			func(t *testing.T, v map[string]string) { want(t, v, VarReason, reasonBadArgs) }},
		{"NULL body (no body fetched) is balanced", solo, []targ{strArg(ArgMethod, "POST"), strArg(ArgURI, "/v1/x"), binArg(ArgHeaders, hdrsBin()), {ArgBody, typeNull, nil}},
			func(t *testing.T, v map[string]string) { want(t, v, VarPool, "solo_mixed") }},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, decideOnce(t, tc.agent, tc.args)) })
	}
}

// A prefill/decode deployment exercises the truncation mark (turnout
// refuses to prefill a cut body) and the PD variables.
func TestPrefillDecode(t *testing.T) {
	pf := startFakePrefill(t)
	a := mustAgent(t, fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: pd
    models: [pd]
    policy: {name: round-robin}
    pd: {prefill_timeout: 2s}
    pools:
      - role: prefill
        endpoints: [{name: p0, address: %s}]
      - role: decode
        endpoints: [{name: d0, address: 127.0.0.1:9101}, {name: d1, address: 127.0.0.1:9102}]
`, pf))
	body := chatBody("pd", "hello")
	args := routeArgs("POST", "/v1/chat/completions", body, "content-length", fmt.Sprint(len(body)))
	// The first call only marks it for the second.
	v := decideOnce(t, a, deferPD(args))
	want(t, v, VarPD, "1")
	absent(t, v, VarPool)
	v = decideMsg(t, a, MessageRoutePD, args)
	want(t, v, VarPool, "pd_decode")
	// A config rendered before the second agent existed sends no
	// defer_pd: its one call still gets the whole decision.
	v = decideOnce(t, a, args)
	want(t, v, VarPool, "pd_decode")
	absent(t, v, VarPD)
	want(t, v, VarPrefill, "p0")
	if v[VarKVTransfer] == "" {
		t.Fatalf("no kv_transfer var: %v", v)
	}
	v = decideMsg(t, a, MessageRoutePD, routeArgs("POST", "/v1/chat/completions", body, "content-length", fmt.Sprint(len(body)+100000)))
	want(t, v, VarStatus, "413")
	want(t, v, VarReason, "body_too_large")
}

// startFakePrefill answers every request with kv_transfer_params.
func startFakePrefill(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"x","kv_transfer_params":{"remote_engine_id":"e","remote_block_ids":[1],"remote_host":"h","remote_port":5}}`)
	}}
	go s.Serve(ln) //nolint:errcheck // ends when the listener closes
	t.Cleanup(func() { _ = s.Shutdown() })
	return ln.Addr().String()
}

// A refusal body too large for the ACK frame is replaced, never cut.
func TestRefusalBodyFitsFrame(t *testing.T) {
	a := mustAgent(t, twoDeployments)
	d := newDecider(a.srv, a.names)
	model := strings.Repeat("m", 200)
	payload := messagesPayload(MessageRoute, routeArgs("POST", "/v1/x", chatBody(model, "hi")))
	out, err := ack(d, header{StreamID: 1, FrameID: 1}, payload, nil, 256)
	if err != nil {
		t.Fatal(err)
	}
	if len(out)-4 > 256 {
		t.Fatalf("ACK frame of %d bytes over max-frame-size 256", len(out)-4)
	}
	_, p, _ := readHeader(out[4:])
	v := vars(t, p)
	want(t, v, VarStatus, "404")
	want(t, v, VarBody, string(fallbackBody))
}

func TestNamesFollowConfig(t *testing.T) {
	a := mustAgent(t, oneDeployment)
	n1 := a.names(a.srv.Snapshot())
	if a.names(a.srv.Snapshot()) != n1 {
		t.Fatal("names rebuilt for the same config")
	}
	cfg, err := config.ParseConfig([]byte(strings.Replace(oneDeployment, "[x-session-id]", "[x-tenant]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.srv.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	n2 := a.names(a.srv.Snapshot())
	snap := a.srv.Snapshot()
	if n2 == n1 || !snap.Forwarded([]byte("X_Tenant")) || snap.Forwarded([]byte("x-session-id")) {
		t.Fatal("names did not follow the new config")
	}
}

func want(t *testing.T, v map[string]string, k, w string) {
	t.Helper()
	if v[k] != w {
		t.Fatalf("%s = %q, want %q (all: %v)", k, v[k], w, v)
	}
}

func absent(t *testing.T, v map[string]string, ks ...string) {
	t.Helper()
	for _, k := range ks {
		if _, ok := v[k]; ok {
			t.Fatalf("%s set to %q", k, v[k])
		}
	}
}

func other(s, a, b string) string {
	if s == a {
		return b
	}
	return a
}

// The agent marks an answer for relay (sets its body) exactly when the
// contract says relay (contract.GlueActionFor), with the relay status the
// table gives; every other answer leaves the fail mode to the config.
func TestVerdictFollowsReasonRules(t *testing.T) {
	cases := []struct {
		status int
		reason string
	}{
		{404, "model_not_found"}, {400, "invalid_body"}, {401, "prefill_rejected"}, {418, "prefill_rejected"},
		{503, contract.ReasonNoEndpoint}, {503, "tokenizer_unavailable"}, {500, ""},
	}
	for _, r := range contract.ReasonRules() {
		cases = append(cases, struct {
			status int
			reason string
		}{r.Status, r.Reason})
	}
	d := newDecider(nil, nil)
	for i, c := range cases {
		// Every other case asks the client to come back: only a relayed
		// answer carries that on (a failed-over one is the proxy's to answer).
		retry := i%2 == 1
		d.v = contract.Verdict{Status: c.status, Reason: c.reason, Body: []byte(`{"error":{}}`), RetryAfter: retry}
		w := actions{limit: 1 << 16}
		d.verdict(&w)
		v := vars(t, w.dst)
		relay := contract.GlueActionFor(c.status, []byte(c.reason)) == contract.GlueRelay
		if _, hasBody := v[VarBody]; hasBody != relay {
			t.Errorf("%d %q: body set %v, want relay %v (%v)", c.status, c.reason, hasBody, relay, v)
		}
		if ra, ok := v[VarRetryAfter]; ok != (relay && retry) || (ok && ra != contract.RetryAfterSeconds) {
			t.Errorf("%d %q retry %v: %s %q set %v, want %v", c.status, c.reason, retry, VarRetryAfter, ra, ok, relay && retry)
		}
		wantStatus := c.status
		if relay {
			wantStatus = contract.RelayStatus(c.status)
		}
		want(t, v, VarStatus, strconv.Itoa(wantStatus))
		if _, ok := v[VarServer]; ok {
			t.Errorf("%d %q: server set", c.status, c.reason)
		}
	}
	// 418 is not a status HAProxy's return rules list: relayed as 400.
	if contract.RelayStatus(418) != 400 || contract.RelayStatus(404) != 404 || contract.RelayStatus(502) != 502 {
		t.Error("RelayStatus does not follow the table")
	}
}
