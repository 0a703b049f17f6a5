//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// ngSlowStream makes a replica emit one token every 100 ms.
func ngSlowStream(c *mock.Config) {
	c.TimeScale = 1
	c.TTFTOverhead = 20 * time.Millisecond
	c.PerTokenPrefill = 0
	c.InterTokenLatency = 100 * time.Millisecond
}

// TestNginx runs the checks that share one stack: header- and body-mode
// deployments with session, prefix and least-request policies, two slow
// streaming replicas and a prefill/decode deployment behind one nginx.
func TestNginx(t *testing.T) {
	s := startNginxStack(t, "open",
		ndep{name: "chat", policy: policySession, mode: "header", mocks: mocks(t, "hchat", 3, nil)},
		ndep{name: "chatb", policy: policySession, mode: "body", mocks: mocks(t, "bchat", 3, nil)},
		ndep{name: "llama", policy: policyPrefix, mode: "body", mocks: mocks(t, "llama", 3, nil)},
		ndep{name: "stream", policy: policyLeast, mode: "body", mocks: mocks(t, "bstream", 1, ngSlowStream)},
		ndep{name: "streamh", policy: policyLeast, mode: "header", mocks: mocks(t, "hstream", 1, ngSlowStream)},
		ndep{name: "pd", policy: policyLeast, mode: "body",
			prefill: mocks(t, "prefill", 2, func(c *mock.Config) { c.Role = mock.RolePrefill }),
			decode: mocks(t, "decode", 1, func(c *mock.Config) {
				c.Role = mock.RoleDecode
				c.TimeScale = 1
				c.TTFTOverhead = 5 * time.Millisecond
				c.PerTokenPrefill = 0
				c.InterTokenLatency = 10 * time.Millisecond
			})},
	)
	t.Run("SessionSpellings", func(t *testing.T) {
		t.Run("HeaderMode", func(t *testing.T) { checkSessionSpellings(t, s, "chat", map[string]string{"X-Model": "chat"}) })
		t.Run("BodyMode", func(t *testing.T) { checkSessionSpellings(t, s, "chatb", nil) })
	})
	t.Run("PrefixRouting", func(t *testing.T) { checkPrefixRouting(t, s, "llama") })
	t.Run("StreamingNotBuffered", func(t *testing.T) {
		t.Run("BodyMode", func(t *testing.T) { ngStreaming(t, s, "stream", nil) })
		t.Run("HeaderMode", func(t *testing.T) { ngStreaming(t, s, "streamh", map[string]string{"X-Model": "streamh"}) })
	})
	t.Run("UnknownModelAndGarbage", func(t *testing.T) { ngRefusals(t, s) })
	t.Run("SpoofedHeadersIgnored", func(t *testing.T) { ngSpoof(t, s) })
	t.Run("BodyTooLarge", func(t *testing.T) { ngTooLarge(t, s) })
	t.Run("PrefillDecode", func(t *testing.T) { ngPD(t, s) })
	t.Run("OpenAINodeClient", func(t *testing.T) { checkOpenAINode(t, s.N.URL, "llama", "pd") })
	t.Run("PathGuard", func(t *testing.T) { checkPathGuard(t, s, "chatb", nil) })
	t.Run("ClientInputsStripped", func(t *testing.T) {
		t.Run("BodyMode", func(t *testing.T) { checkClientInputsStripped(t, s, "chatb", nil) })
		t.Run("HeaderMode", func(t *testing.T) { checkClientInputsStripped(t, s, "chat", map[string]string{"X-Model": "chat"}) })
	})
	t.Run("LargeHeaders", func(t *testing.T) {
		t.Run("BodyMode", func(t *testing.T) { checkLargeHeaders(t, s, "chatb", nil) })
		t.Run("HeaderMode", func(t *testing.T) { checkLargeHeaders(t, s, "chat", map[string]string{"X-Model": "chat"}) })
	})
	t.Run("LongModelRefused", func(t *testing.T) { checkLongModelRefused(t, s, nil) })
	t.Run("InflightBackToZero", func(t *testing.T) { ngInflight(t, s) })
}

// TestNginxHeaderOnly: one deployment in header mode, the stock setup
// (auth_request, no njs on the request path): routing without a model
// header, turnout's refusals relayed, other methods served by the pool.
func TestNginxHeaderOnly(t *testing.T) {
	s := startNginxStack(t, "open", ndep{name: "chat", policy: policySession, mode: "header", mocks: mocks(t, "ho", 3, nil)})
	t.Run("SessionSpellings", func(t *testing.T) { checkSessionSpellings(t, s, "chat", nil) })
	t.Run("UnknownModelRelayed", func(t *testing.T) {
		r := s.post(t, "/v1/chat/completions", chatBody("chat", "s", "u", false), map[string]string{"X-Model": "no-such-model"})
		if r.Status != 404 || !json.Valid(r.Body) || !strings.Contains(string(r.Body), "model_not_found") ||
			r.Header.Get("X-Turnout-Reason") != "model_not_found" || r.Header.Get("X-Replica") != "" {
			t.Errorf("unknown model in header mode: %d reason %q replica %q: %s", r.Status, r.Header.Get("X-Turnout-Reason"), r.Header.Get("X-Replica"), r.Body)
		}
		for _, h := range []string{"X-Turnout-Server", "X-Turnout-Decision"} {
			if r.Header.Get(h) != "" {
				t.Errorf("refusal leaks %s to the client", h)
			}
		}
	})
	t.Run("GetModelsServed", func(t *testing.T) {
		res, err := s.client.Get(s.N.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("X-Replica") == "" {
			t.Errorf("GET /v1/models: %d replica %q", res.StatusCode, res.Header.Get("X-Replica"))
		}
	})
	t.Run("InternalNotReachable", func(t *testing.T) {
		for _, p := range []string{"/internal/route", "/_turnout/header", "/_turnout/ask_headers", "/_turnout/after_relay", "/v1/../internal/route"} {
			r := s.post(t, p, []byte(`{}`), nil)
			if r.Status != 404 || r.Header.Get("X-Turnout-Server") != "" {
				t.Errorf("POST %s from outside: %d %s", p, r.Status, r.Body)
			}
		}
	})
	t.Run("InflightBackToZero", func(t *testing.T) { ngInflight(t, s) })
}

// ngStreamEvents posts a streaming chat request and returns the arrival time
// of each content event, whether [DONE] came, and the response.
func ngStreamEvents(t *testing.T, c *http.Client, url string, body []byte, hdr map[string]string) ([]time.Time, bool, *http.Response) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = []string{v}
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		t.Fatalf("stream: status %d: %s", res.StatusCode, b.Bytes())
	}
	var arrivals []time.Time
	done := false
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"delta":{"content"`):
			arrivals = append(arrivals, time.Now())
		}
	}
	return arrivals, done, res
}

// 3. SSE chunks 100 ms apart reach the client as they are sent.
func ngStreaming(t *testing.T, s *nstack, model string, hdr map[string]string) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "messages": []map[string]string{{"role": "user", "content": "count"}},
		"max_tokens": 6, "stream": true,
	})
	arrivals, done, _ := ngStreamEvents(t, s.client, s.N.URL+"/v1/chat/completions", body, hdr)
	if len(arrivals) < 5 || !done {
		t.Fatalf("got %d content chunks (done %v), want >= 5 and [DONE]", len(arrivals), done)
	}
	// Tokens are generated 100 ms apart; each must arrive within 50 ms of
	// its schedule, measured from the previous token's arrival.
	for i := 1; i < len(arrivals); i++ {
		gap := arrivals[i].Sub(arrivals[i-1])
		if gap < 50*time.Millisecond || gap > 150*time.Millisecond {
			t.Errorf("chunk %d arrived %v after the previous one, want 100ms +- 50ms (buffering?)", i, gap)
		}
	}
}

// 6. Unknown model: turnout's 404 JSON reaches the client; garbage is served.
func ngRefusals(t *testing.T, s *nstack) {
	r := s.post(t, "/v1/chat/completions", chatBody("no-such-model", "s", "u", false), nil)
	if r.Status != 404 || !json.Valid(r.Body) || !strings.Contains(string(r.Body), "model_not_found") || r.Header.Get("X-Turnout-Reason") != "model_not_found" {
		t.Errorf("unknown model: %d reason %q: %s", r.Status, r.Header.Get("X-Turnout-Reason"), r.Body)
	}
	if r.Header.Get("X-Replica") != "" {
		t.Errorf("unknown model reached replica %s", r.Header.Get("X-Replica"))
	}
	r = s.post(t, "/v1/chat/completions", []byte(`{"model":"chatb","messages":[{"role":"user","content":"x"}`+"\x00garbage"), nil)
	if r.Header.Get("X-Replica") == "" {
		t.Errorf("garbage body was not served by a replica: %d %s", r.Status, r.Body)
	}
	r = s.post(t, "/v1/chat/completions", []byte("not json at all"), map[string]string{"X-Model": "chat"})
	if r.Header.Get("X-Replica") == "" {
		t.Errorf("garbage body in header mode was not served by a replica: %d %s", r.Status, r.Body)
	}
}

// 6. Client-sent X-Turnout-* headers neither pick the server nor reach it,
// in either mode.
func ngSpoof(t *testing.T, s *nstack) {
	for _, c := range []struct {
		model string
		extra map[string]string
	}{{"chatb", nil}, {"chat", map[string]string{"X-Model": "chat"}}} {
		hdr := map[string]string{"X-Session-ID": "spoof-test"}
		for k, v := range c.extra {
			hdr[k] = v
		}
		home := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", "u", false), hdr).Header.Get("X-Replica")
		var other *Mock
		for _, m := range s.dep(c.model).mocks {
			if m.Name != home {
				other = m
			}
		}
		hdr["X-Turnout-Server"] = other.Name
		hdr["X-Turnout-Backend"] = other.Addr
		hdr["X-Turnout-Pool"] = "llama_mixed"
		hdr["X-Turnout-Decision"] = "00000000000000ff"
		hdr["X-Turnout-Kv-Transfer"] = "e30="
		for i := range 10 {
			r := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", "u", false), hdr)
			if got := r.Header.Get("X-Replica"); got != home {
				t.Fatalf("%s: request %d with X-Turnout-Server %s landed on %s, want %s", c.model, i, other.Name, got, home)
			}
		}
		res, err := http.Get("http://" + s.mock(home).Addr + "/mock/requests")
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(res.Body)
		res.Body.Close()
		if strings.Contains(strings.ToLower(buf.String()), "x-turnout-") {
			t.Errorf("%s: the replica received a client's X-Turnout-* header", c.model)
		}
	}
}

// 8. A body over the limit: a JSON 413 from nginx at once, not a hang, with
// Content-Length and chunked alike.
func ngTooLarge(t *testing.T, s *nstack) {
	big := chatBody("chatb", strings.Repeat("x", 300<<10), "u", false)
	for _, chunked := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var rd = bytes.NewReader(big)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.N.URL+"/v1/chat/completions", rd)
		if chunked {
			req, _ = http.NewRequestWithContext(ctx, http.MethodPost, s.N.URL+"/v1/chat/completions", struct{ *bytes.Reader }{rd})
			req.ContentLength = -1
		}
		start := time.Now()
		res, err := s.client.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("chunked=%v: %v", chunked, err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		res.Body.Close()
		cancel()
		if res.StatusCode != 413 || res.Header.Get("X-Turnout-Reason") != "body_too_large" || !json.Valid(b.Bytes()) || res.Header.Get("X-Replica") != "" {
			t.Errorf("chunked=%v: %d reason %q: %s", chunked, res.StatusCode, res.Header.Get("X-Turnout-Reason"), b.Bytes())
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("chunked=%v: 413 took %v", chunked, d)
		}
	}
}

// Issue 6 through nginx: the decode body carries the prefill's
// kv_transfer_params, the stream arrives whole, turnout's PD errors are
// relayed as they are.
func ngPD(t *testing.T, s *nstack) {
	d := s.dep("pd")
	for _, m := range slices.Concat(d.prefill, d.decode) {
		if res, err := http.Post("http://"+m.Addr+mock.PathRequestsClear, "", nil); err == nil {
			res.Body.Close()
		}
	}
	body, _ := json.Marshal(map[string]any{
		"model":          "pd",
		"messages":       []map[string]string{{"role": "system", "content": strings.Repeat("Prefill me. ", 50)}, {"role": "user", "content": "日本語で答えて"}},
		"max_tokens":     8,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	})
	arrivals, done, res := ngStreamEvents(t, s.client, s.N.URL+"/v1/chat/completions", body, map[string]string{"X-Session-ID": "pd-1"})
	if len(arrivals) != 8 || !done {
		t.Errorf("PD stream: %d content chunks (want 8), [DONE] %v", len(arrivals), done)
	}
	if got := res.Header.Get(mock.HeaderKVTransfer); got != "valid" {
		t.Errorf("decode replica reports %s %q, want valid", mock.HeaderKVTransfer, got)
	}
	if res.Header.Get("X-Replica") != d.decode[0].Name {
		t.Errorf("served by %q, want the decode replica %s", res.Header.Get("X-Replica"), d.decode[0].Name)
	}
	// The prefill request as a prefill replica saw it.
	var prefills []map[string]any
	for _, m := range d.prefill {
		for _, e := range ngMockRequests(t, m) {
			if e.Path == mock.PathChat {
				prefills = append(prefills, e.Body)
			}
		}
	}
	if len(prefills) != 1 {
		t.Fatalf("prefill replicas saw %d chat requests, want 1", len(prefills))
	}
	p := prefills[0]
	kv, _ := p["kv_transfer_params"].(map[string]any)
	if p["max_tokens"] != float64(1) || p["stream"] != false || p["stream_options"] != nil || kv["do_remote_decode"] != true {
		t.Errorf("prefill body: max_tokens %v stream %v stream_options %v kv %v", p["max_tokens"], p["stream"], p["stream_options"], kv)
	}
	// The decode request carries the params and the client's body otherwise.
	dec := ngMockRequests(t, d.decode[0])
	if len(dec) != 1 {
		t.Fatalf("decode replica saw %d requests, want 1", len(dec))
	}
	dkv, _ := dec[0].Body["kv_transfer_params"].(map[string]any)
	if dkv["do_remote_prefill"] != true || dec[0].Body["stream"] != true || dec[0].Body["max_tokens"] != float64(8) {
		t.Errorf("decode body: kv %v stream %v max_tokens %v", dkv, dec[0].Body["stream"], dec[0].Body["max_tokens"])
	}
	if msgs, _ := dec[0].Body["messages"].([]any); len(msgs) != 2 || !strings.Contains(fmt.Sprint(msgs[1]), "日本語で答えて") {
		t.Errorf("decode messages changed: %v", dec[0].Body["messages"])
	}

	t.Run("ClientKVParamsRefused", func(t *testing.T) {
		b := []byte(`{"model":"pd","messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"do_remote_prefill":true}}`)
		r := s.post(t, "/v1/chat/completions", b, nil)
		if r.Status != 400 || r.Header.Get("X-Turnout-Reason") != "kv_transfer_params_not_allowed" || r.Header.Get("X-Replica") != "" {
			t.Errorf("client kv_transfer_params: %d %q %s", r.Status, r.Header.Get("X-Turnout-Reason"), r.Body)
		}
	})
	t.Run("PrefillFailureRelayed", func(t *testing.T) {
		for _, m := range d.prefill {
			if err := m.SetFaults(mock.Faults{FailRate: 1}); err != nil {
				t.Fatal(err)
			}
		}
		defer func() {
			for _, m := range d.prefill {
				_ = m.SetFaults(mock.Faults{})
			}
		}()
		before := d.decode[0].Stats().Requests
		r := s.post(t, "/v1/chat/completions", chatBody("pd", "s", "u", true), nil)
		if r.Status != 502 || r.Header.Get("X-Turnout-Reason") != "prefill_failed" || !json.Valid(r.Body) || r.Header.Get("X-Replica") != "" {
			t.Errorf("prefill failure: %d %q %s", r.Status, r.Header.Get("X-Turnout-Reason"), r.Body)
		}
		if n := d.decode[0].Stats().Requests - before; n != 0 {
			t.Errorf("decode replica got %d requests after a failed prefill", n)
		}
	})
}

type ngMockRequest struct {
	Path    string            `json:"path"`
	Body    map[string]any    `json:"body"`
	Headers map[string]string `json:"headers"`
}

func ngMockRequests(t *testing.T, m *Mock) []ngMockRequest {
	t.Helper()
	res, err := http.Get("http://" + m.Addr + mock.PathRequests)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out []ngMockRequest
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatalf("%s /mock/requests: %v", m.Name, err)
	}
	return out
}

// After the tests above, turnout's in-flight counts come back to 0 through
// the syslog completion feedback.
func ngInflight(t *testing.T, s *nstack) {
	var wg sync.WaitGroup
	var failed atomic.Int64
	models := []string{}
	hdrs := []map[string]string{}
	for _, d := range s.deps {
		if len(d.mocks) == 0 {
			continue
		}
		models = append(models, d.name)
		if d.mode == "header" {
			hdrs = append(hdrs, map[string]string{"X-Model": d.name})
		} else {
			hdrs = append(hdrs, map[string]string{})
		}
	}
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := i % len(models)
			h := map[string]string{"X-Session-ID": fmt.Sprint(i)}
			for hk, hv := range hdrs[k] {
				h[hk] = hv
			}
			r, err := Post(context.Background(), s.client, s.N.URL+"/v1/chat/completions", chatBody(models[k], "burst", fmt.Sprintf("q%d", i), i%3 == 0), h)
			if err != nil || r.Status != 200 {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d burst requests failed", failed.Load())
	}
	Eventually(t, 10*time.Second, "turnout_endpoint_inflight to return to 0", func() bool {
		v, err := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	})
}

// 4. Membership changes under load: TestNginxChurnNoReload
// (nginx_churn_test.go).

// 5. turnout stopped: fail-open keeps serving (header and body mode) with
// little added latency; fail-closed answers 503 with a reason.
func TestNginxTurnoutDown(t *testing.T) {
	deps := func(p string) []ndep {
		return []ndep{
			{name: "hdr", policy: policyLeast, mode: "header", mocks: mocks(t, p+"h", 2, nil)},
			{name: "bdy", policy: policyLeast, mode: "body", mocks: mocks(t, p+"b", 2, nil)},
		}
	}
	cases := []struct {
		model string
		hdr   map[string]string
	}{{"hdr", map[string]string{"X-Model": "hdr"}}, {"bdy", nil}}
	t.Run("FailOpen", func(t *testing.T) {
		s := startNginxStack(t, "open", deps("o")...)
		base := map[string][]time.Duration{}
		for _, c := range cases {
			for range 20 {
				r := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", "u", false), c.hdr)
				if r.Status != 200 {
					t.Fatalf("%s, turnout up: status %d", c.model, r.Status)
				}
				base[c.model] = append(base[c.model], r.Dur)
			}
		}
		s.T.Stop()
		for _, c := range cases {
			var down []time.Duration
			for i := range 30 {
				r := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", "u", false), c.hdr)
				pool := s.dep(c.model).mocks
				if r.Status != 200 || !slices.ContainsFunc(pool, func(m *Mock) bool { return m.Name == r.Header.Get("X-Replica") }) {
					t.Fatalf("%s, turnout down, request %d: status %d replica %q %s", c.model, i, r.Status, r.Header.Get("X-Replica"), r.Body)
				}
				down = append(down, r.Dur)
			}
			if d := median(down) - median(base[c.model]); d > 50*time.Millisecond {
				t.Errorf("%s: added latency with turnout down: %v (median %v vs %v)", c.model, d, median(down), median(base[c.model]))
			}
			t.Logf("%s: median latency turnout up %v, down %v, worst down %v", c.model, median(base[c.model]), median(down), maxDur(down))
		}
	})
	t.Run("FailClosed", func(t *testing.T) {
		s := startNginxStack(t, "closed", deps("c")...)
		for _, c := range cases {
			if r := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", "u", false), c.hdr); r.Status != 200 {
				t.Fatalf("%s, turnout up: status %d", c.model, r.Status)
			}
		}
		s.T.Stop()
		for _, c := range cases {
			for i := range 5 {
				r := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", "u", false), c.hdr)
				if r.Status != 503 || r.Header.Get("X-Turnout-Reason") == "" || r.Header.Get("X-Replica") != "" || !json.Valid(r.Body) {
					t.Fatalf("%s, request %d: status %d reason %q replica %q: %s", c.model, i, r.Status, r.Header.Get("X-Turnout-Reason"), r.Header.Get("X-Replica"), r.Body)
				}
			}
		}
	})
}

// The replica turnout picked refuses connections (and turnout does not know
// yet): nginx resends the request to the verdict's first fallback, in both
// modes, and the completion feedback still closes turnout's decision.
func TestNginxReplicaDown(t *testing.T) {
	s := (&nstack{failMode: "open", noHealth: true, deps: []ndep{
		{name: "hdr", policy: policySession, mode: "header", mocks: mocks(t, "dh", 3, nil)},
		{name: "bdy", policy: policySession, mode: "body", mocks: mocks(t, "db", 3, nil)},
	}}).start(t)
	for _, c := range []struct {
		model string
		hdr   map[string]string
	}{{"hdr", map[string]string{"X-Model": "hdr"}}, {"bdy", map[string]string{}}} {
		c.hdr["X-Session-ID"] = "pinned"
		home := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", "u", false), c.hdr).Header.Get("X-Replica")
		dead := s.mock(home)
		if dead == nil {
			t.Fatalf("%s: no home replica", c.model)
		}
		// turnout's verdict for the session names the home replica and,
		// first of its fallbacks, where nginx must resend (asked for, as
		// the nginx glue asks).
		ask := map[string]string{"X-Turnout-Want": "fallback_addr"}
		for k, v := range c.hdr {
			ask[k] = v
		}
		v, err := Post(context.Background(), http.DefaultClient, s.T.URL+"/internal/route", chatBody(c.model, "s", "u", false), ask)
		if err != nil || v.Header.Get("X-Turnout-Server") != home || v.Header.Get("X-Turnout-Fallback-Backend") == "" {
			t.Fatalf("%s: verdict %v %v", c.model, v, err)
		}
		fallback, _, _ := strings.Cut(v.Header.Get("X-Turnout-Fallbacks"), ",")
		if m := s.mock(fallback); m == nil || m.Addr != v.Header.Get("X-Turnout-Fallback-Backend") {
			t.Fatalf("%s: X-Turnout-Fallback-Backend %q is not the address of the first fallback %q", c.model, v.Header.Get("X-Turnout-Fallback-Backend"), fallback)
		}
		// That call opened a decision no request will close.
		if r, err := Post(context.Background(), http.DefaultClient, s.T.URL+"/internal/done?id="+v.Header.Get("X-Turnout-Decision"), nil,
			map[string]string{"X-Turnout-Token": s.T.FeedbackToken(t)}); err != nil || r.Status != 204 {
			t.Fatalf("close the verdict's decision: %v %v", r, err)
		}
		if err := dead.Close(); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			r := s.post(t, "/v1/chat/completions", chatBody(c.model, "s", fmt.Sprint(i), i%2 == 0), c.hdr)
			if r.Status != 200 || r.Header.Get("X-Replica") != fallback {
				t.Fatalf("%s, request %d with its replica %s down: %d %q (want the verdict's first fallback %s) %s", c.model, i, home, r.Status, r.Header.Get("X-Replica"), fallback, r.Body)
			}
		}
	}
	Eventually(t, 10*time.Second, "turnout_endpoint_inflight to return to 0", func() bool {
		v, err := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	})
}
