//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/nginx"
)

// The request log through each glue tells streams apart: a stream the
// client left after its first event is flagged cut by the client (term from
// HAProxy's %ts, nginx's $request_completion), a whole one is not; every line
// has the method, the path and a request id, the client's or the one the
// proxy made, which the replica got too. A refusal is one line and one count.

// reqlogStack is one proxy in front of turnout and one slow-streaming mock.
type reqlogStack struct {
	url, turnoutURL, logPath string
	mock                     *Mock
	// errorLog is the proxy's error log ("" when not checked).
	errorLog string
}

// slowMock streams one token per 50 ms: a 100-token answer lasts 5 s, long
// enough for the client to leave in the middle.
func slowMock(t *testing.T) *Mock {
	return StartMock(t, "m0", func(c *mock.Config) { c.InterTokenLatency = 50 * time.Millisecond })
}

func TestRequestLogStreamsHAProxy(t *testing.T) {
	NeedHAProxy(t)
	for _, path := range []string{"spoe", "lua"} {
		t.Run(path, func(t *testing.T) {
			m := slowMock(t)
			dir := t.TempDir()
			logPath := filepath.Join(t.TempDir(), "requests.log")
			turnoutAddr, haAddr := FreeAddr(t), FreeAddr(t)
			cfg := fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
haproxy: {listen: %q, dir: %q, path: %s}
request_log: {sample: 1, to: file, file: %q}
deployments:
  - name: llama
    models: [llama]
    pools: [{role: mixed, endpoints: [{name: m0, address: %q}]}]
`, turnoutAddr, FreeUDPAddr(t), haAddr, dir, path, logPath, m.Addr)
			tu := StartTurnout(t, turnoutAddr, cfg, "--haproxy-dir", dir)
			h := StartRenderedHAProxy(t, dir, haAddr)
			h.WaitServersUp(t, "llama_mixed/m0")
			checkStreamsLogged(t, reqlogStack{url: h.URL, turnoutURL: tu.URL, logPath: logPath, mock: m})
			checkReplicaCut(t, h.URL, logPath, m)
		})
	}
}

// checkReplicaCut: a stream the replica ends after two events, without
// its final chunk, is flagged cut by the replica (HAProxy's %ts "SD"; nginx
// cannot tell, docs/request-log.md).
func checkReplicaCut(t *testing.T, url, logPath string, m *Mock) {
	t.Helper()
	if err := m.SetFaults(mock.Faults{DieAfterChunks: 2}); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"model":"llama","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"tell me a story"}]}`)
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "replica-cut-1")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, rerr := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if rerr == nil {
		t.Errorf("the client read a whole answer from a replica that died mid-stream")
	}
	var line map[string]any
	Eventually(t, 30*time.Second, "the cut stream's line", func() bool {
		for _, l := range readRequestLog(t, logPath) {
			if l["request_id"] == "replica-cut-1" {
				line = l
			}
		}
		return line != nil
	})
	if line["cut"] != "replica" || !strings.HasPrefix(fmt.Sprint(line["term"]), "S") {
		t.Errorf("a stream the replica cut: cut %v term %v, want cut replica, term S*: %v", line["cut"], line["term"], line)
	}
}

func TestRequestLogStreamsNginx(t *testing.T) {
	for _, mode := range []string{"header", "body"} {
		t.Run(mode, func(t *testing.T) {
			m := slowMock(t)
			logPath := filepath.Join(t.TempDir(), "requests.log")
			s := (&nstack{failMode: "closed", extraYAML: fmt.Sprintf("request_log: {sample: 1, to: file, file: %q}\n", logPath),
				deps: []ndep{{name: "llama", policy: "{name: round-robin}", mode: mode, mocks: []*Mock{m}}}}).start(t)
			checkStreamsLogged(t, reqlogStack{url: s.N.URL, turnoutURL: s.T.URL, logPath: logPath, mock: m,
				errorLog: filepath.Join(s.dir, nginx.ErrorLogName)})
		})
	}
}

func checkStreamsLogged(t *testing.T, s reqlogStack) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	// One header mode cannot read the model from the body.
	hdr := func(extra ...string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}, "X-Model": {"llama"}}
		for i := 0; i+1 < len(extra); i += 2 {
			h.Set(extra[i], extra[i+1])
		}
		return h
	}

	// A stream the client leaves after its first event.
	body := []byte(`{"model":"llama","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"tell me a long story"}]}`)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header = hdr("X-Request-Id", "client-gone-1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	cancel()
	resp.Body.Close()

	// A whole answer, without a request id: the proxy makes one.
	req, _ = http.NewRequest("POST", s.url+"/v1/chat/completions", bytes.NewReader(chatBody("llama", "sys", "hello", false)))
	req.Header = hdr()
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("whole answer: %d", resp.StatusCode)
	}

	// A refusal: one line, one count, the client's body as turnout wrote it.
	req, _ = http.NewRequest("POST", s.url+"/v1/chat/completions", bytes.NewReader(chatBody("no-such-model", "sys", "hello", false)))
	req.Header = hdr("X-Model", "no-such-model", "X-Request-Id", "refused-1")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(rb), "model_not_found") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, rb)
	}

	var cut, whole, refused []map[string]any
	Eventually(t, 30*time.Second, "the three request log lines", func() bool {
		cut, whole, refused = nil, nil, nil
		for _, l := range readRequestLog(t, s.logPath) {
			switch {
			case l["request_id"] == "client-gone-1":
				cut = append(cut, l)
			case l["reason"] == "model_not_found":
				refused = append(refused, l)
			case l["state"] == "closed":
				whole = append(whole, l)
			}
		}
		return len(cut) == 1 && len(whole) == 1 && len(refused) >= 1
	})
	t.Logf("cut: %v\nwhole: %v\nrefused: %v", cut[0], whole[0], refused[0])
	for what, l := range map[string]map[string]any{"cut": cut[0], "whole": whole[0], "refused": refused[0]} {
		if l["method"] != "POST" || l["path"] != "/v1/chat/completions" {
			t.Errorf("%s: method %v path %v, want POST /v1/chat/completions", what, l["method"], l["path"])
		}
	}
	if c := cut[0]; c["cut"] != "client" || !strings.HasPrefix(fmt.Sprint(c["term"]), "C") {
		t.Errorf("the stream the client left: cut %v term %v, want cut client, term C*", c["cut"], c["term"])
	}
	w := whole[0]
	if _, ok := w["cut"]; ok || w["term"] != "--" {
		t.Errorf("the whole answer: cut %v term %v, want no cut, term --", w["cut"], w["term"])
	}
	rid, _ := w["request_id"].(string)
	if len(rid) < 16 {
		t.Errorf("the whole answer: request_id %q, want one the proxy made", rid)
	}
	if refused[0]["request_id"] != "refused-1" {
		t.Errorf("refused: request_id %v, want refused-1", refused[0]["request_id"])
	}

	// The replica got the same request ids.
	got := map[string]bool{}
	for _, r := range ngMockRequests(t, s.mock) {
		got[r.Headers["x-request-id"]] = true
	}
	for _, want := range []string{"client-gone-1", rid} {
		if !got[want] {
			t.Errorf("the replica did not get X-Request-Id %q (got %v)", want, got)
		}
	}

	// The lookup tells the same.
	id, _ := cut[0]["decision"].(string)
	lr, err := client.Get(s.turnoutURL + "/internal/decision/" + id)
	if err != nil {
		t.Fatal(err)
	}
	lb, _ := io.ReadAll(lr.Body)
	lr.Body.Close()
	for _, f := range []string{`"request_id":"client-gone-1"`, `"cut":"client"`, `"method":"POST"`, `"path":"/v1/chat/completions"`} {
		if !strings.Contains(string(lb), f) {
			t.Errorf("GET /internal/decision/%s lacks %s: %s", id, f, lb)
		}
	}

	// One refusal: one line, counted once.
	if len(refused) != 1 {
		t.Errorf("%d request log lines for one refusal, want 1: %v", len(refused), refused)
	}
	n, err := Metric(t, s.turnoutURL+"/metrics", "turnout_refusals_total", `reason="model_not_found"`)
	if err != nil || n != 1 {
		t.Errorf("turnout_refusals_total{reason=model_not_found} = %v (%v), want 1", n, err)
	}
	if s.errorLog != "" {
		if b, _ := os.ReadFile(s.errorLog); bytes.Contains(b, []byte("auth request unexpected status")) {
			t.Errorf("nginx logged a client's 4xx at error level:\n%s", b)
		}
	}
}
