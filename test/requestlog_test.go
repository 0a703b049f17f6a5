//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// resetReplica answers GET (health, /v1/models) like a replica serving
// model and resets every POST before a byte of answer: a replica that
// looks alive to every check and fails each request, so HAProxy
// (l7_retries) retries the request on another server.
func resetReplica(t *testing.T, model string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	models := fmt.Sprintf(`{"object":"list","data":[{"id":%q,"object":"model"}]}`, model)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					for { // the rest of the head
						h, err := br.ReadString('\n')
						if err != nil || h == "\r\n" {
							break
						}
					}
					if !strings.HasPrefix(line, "GET ") {
						_ = c.(*net.TCPConn).SetLinger(0) // RST, not FIN
						return
					}
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(models), models)
				}
			}(c)
		}
	}()
	return ln.Addr().String()
}

// readRequestLog reads the request log's JSON lines.
// waitRoutedFailedRefused waits for the request log's three lines of the
// failover tests: a request closed on "good", one closed on "reset" (failed
// over by the proxy), and the 404 refusal.
func waitRoutedFailedRefused(t *testing.T, logPath string) (routed, failedOver, refused map[string]any) {
	t.Helper()
	Eventually(t, 10*time.Second, "request log lines", func() bool {
		routed, failedOver, refused = nil, nil, nil
		for _, l := range readRequestLog(t, logPath) {
			switch {
			case l["status"] == 404.0:
				refused = l
			case l["endpoint"] == "good" && l["state"] == "closed":
				routed = l
			case l["endpoint"] == "reset" && l["state"] == "closed":
				failedOver = l
			}
		}
		return routed != nil && failedOver != nil && refused != nil
	})
	t.Logf("routed:      %v\nfailed over: %v\nrefused:     %v", routed, failedOver, refused)
	return routed, failedOver, refused
}

func readRequestLog(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []map[string]any
	for line := range bytes.Lines(b) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("request log line is not JSON (%v): %s", err, line)
		}
		out = append(out, m)
	}
	return out
}

// TestRequestLogHAProxySPOE: turnout + HAProxy over the default SPOE path,
// one real replica and one that resets every request. The request log (a
// file) has, with the right fields: a request routed to the good replica,
// a request routed to the resetting one and served by the good one after
// HAProxy's retry, and a 404 turnout refused (unknown model). GET
// /internal/decision/<id> answers the same fields for a logged decision
// and 404 for an unknown one.
func TestRequestLogHAProxySPOE(t *testing.T) {
	NeedHAProxy(t)
	good := StartMock(t, "good", nil)
	bad := resetReplica(t, "llama")
	dir := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "requests.log")
	turnoutAddr, haAddr, syslog := FreeAddr(t), FreeAddr(t), FreeUDPAddr(t)
	cfg := fmt.Sprintf(`listen: %s
session_headers: [x-session-id]
fallbacks: 1
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
haproxy: {listen: %q, dir: %q, path: spoe, l7_retries: true, nbthread: 2}
request_log: {sample: 1, to: file, file: %q}
deployments:
  - name: llama
    models: [llama]
    policy: {name: round-robin}
    pools:
      - role: mixed
        endpoints:
          - {name: good, address: %q}
          - {name: reset, address: %q}
`, turnoutAddr, syslog, haAddr, dir, logPath, good.Addr, bad)
	tu := StartTurnout(t, turnoutAddr, cfg, "--haproxy-dir", dir)
	h := StartRenderedHAProxy(t, dir, haAddr)
	h.WaitServersUp(t, "llama_mixed/good", "llama_mixed/reset")
	// turnout started first ("HAProxy is not reachable"), then says when it answers.
	Eventually(t, 10*time.Second, "the connected line", func() bool {
		b, _ := os.ReadFile(tu.Log)
		return bytes.Contains(b, []byte("HAProxy is not reachable")) && bytes.Contains(b, []byte("HAProxy connected"))
	})

	client := &http.Client{Timeout: 10 * time.Second}
	post := func(model, session string) int {
		req, _ := http.NewRequest("POST", h.URL+"/v1/chat/completions", bytes.NewReader(chatBody(model, "sys", "hello", false)))
		req.Header.Set("Content-Type", "application/json")
		if session != "" {
			req.Header.Set("X-Session-Id", session)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Round robin alternates: four requests reach each replica twice.
	for i := range 4 {
		if st := post("llama", fmt.Sprintf("s-%d", i)); st != 200 {
			t.Fatalf("request %d: status %d, want 200 (the reset replica's requests are retried on the good one)", i, st)
		}
	}
	if st := post("no-such-model", ""); st != 404 {
		t.Fatalf("unknown model: status %d, want 404", st)
	}

	routed, failedOver, refused := waitRoutedFailedRefused(t, logPath)
	check := func(what string, l map[string]any, want map[string]any) {
		t.Helper()
		for k, v := range want {
			if l[k] != v {
				t.Errorf("%s: %s = %v, want %v (line %v)", what, k, l[k], v, l)
			}
		}
	}
	common := map[string]any{"deployment": "llama", "model": "llama", "pool": "llama_mixed", "outcome": "balanced",
		"session": true, "status": 200.0, "served_by": "good", "message": "request", "matched_blocks": 0.0}
	check("routed", routed, common)
	check("routed", routed, map[string]any{"retries": 0.0})
	check("failed over", failedOver, common)
	if r, _ := failedOver["retries"].(float64); r < 1 {
		t.Errorf("failed over: retries = %v, want >= 1", failedOver["retries"])
	}
	for _, l := range []map[string]any{routed, failedOver} {
		id, _ := l["decision"].(string)
		if len(id) != 16 {
			t.Errorf("decision %q is not 16 hex digits", id)
		}
		for _, k := range []string{"ttfb_ms", "duration_ms"} {
			if v, ok := l[k].(float64); !ok || v < 0 {
				t.Errorf("%s = %v, want a duration in ms", k, l[k])
			}
		}
		if _, ok := l["start"].(string); !ok {
			t.Errorf("no start time: %v", l)
		}
	}
	check("refused", refused, map[string]any{"model": "no-such-model", "outcome": "refused", "reason": "model_not_found",
		"status": 404.0, "state": "refused", "session": false})
	if _, ok := refused["decision"]; ok {
		t.Errorf("a refusal has a decision id: %v", refused)
	}

	// The lookup answers the same fields.
	id := failedOver["decision"].(string)
	resp, err := client.Get(tu.URL + "/internal/decision/" + id)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil {
		t.Fatalf("lookup %s: %d %v", id, resp.StatusCode, err)
	}
	for _, k := range []string{"decision", "deployment", "model", "endpoint", "pool", "outcome", "matched_blocks", "session", "status", "ttfb_ms", "duration_ms", "retries", "served_by", "state", "start"} {
		if fmt.Sprint(got[k]) != fmt.Sprint(failedOver[k]) {
			t.Errorf("lookup %s = %v, the log line says %v", k, got[k], failedOver[k])
		}
	}
	resp, err = client.Get(tu.URL + "/internal/decision/0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown decision: %d, want 404", resp.StatusCode)
	}
	// HAProxy never serves /internal/* to clients.
	resp, err = client.Get(h.URL + "/internal/decision/" + id)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == 200 {
		t.Errorf("HAProxy served /internal/decision to a client")
	}
}

// TestSPOETrap: `render haproxy --out DIR` then `serve` without
// --haproxy-dir, on a config with neither haproxy.dir nor haproxy.spoe,
// leaves HAProxy's SPOE without an agent: serve says so at warn level and
// in /readyz?verbose. With haproxy.spoe in the config, the config alone
// decides: render writes that address and serve listens on it, no flag
// needed, no warning. render warns in the first case, not in the second.
func TestSPOETrap(t *testing.T) {
	bin := TurnoutBin(t)
	m := StartMock(t, "r0", nil)
	base := func(listen, haproxyLine string) string {
		return fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
haproxy: {%s}
deployments:
  - name: llama
    models: [llama]
    pools:
      - role: mixed
        endpoints:
          - {name: r0, address: %q}
`, listen, FreeUDPAddr(t), haproxyLine, m.Addr)
	}
	// renderTo renders into a new directory and returns it, and whether
	// render warned that the agent address came from --out.
	renderTo := func(cfg string) (string, bool) {
		t.Helper()
		out := t.TempDir()
		path := filepath.Join(t.TempDir(), "turnout.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "render", "haproxy", "--config", path, "--out", out, "--check=false")
		cmd.Env = append(os.Environ(), "TURNOUT_LOG_FORMAT=json")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("render: %v\n%s", err, b)
		}
		return out, bytes.Contains(b, []byte(`"level":"warn"`)) && bytes.Contains(b, []byte("comes from --out"))
	}

	t.Run("trap", func(t *testing.T) {
		listen := FreeAddr(t)
		cfg := base(listen, "listen: "+FreeAddr(t))
		out, warned := renderTo(cfg)
		if !warned {
			t.Error("render did not warn that the agent address came from --out")
		}
		spoe, err := os.ReadFile(filepath.Join(out, "haproxy.cfg"))
		if err != nil || !strings.Contains(string(spoe), "unix@"+out) {
			t.Fatalf("rendered haproxy.cfg does not name the agent socket in %s: %v\n%s", out, err, spoe)
		}
		tu := StartTurnout(t, listen, cfg) // no --haproxy-dir
		Eventually(t, 10*time.Second, "the warning", func() bool {
			b, _ := os.ReadFile(tu.Log)
			for line := range bytes.Lines(b) {
				var l map[string]any
				if json.Unmarshal(line, &l) == nil && l["level"] == "warn" && strings.Contains(fmt.Sprint(l["message"]), "no SPOE agent listens") {
					return true
				}
			}
			return false
		})
		resp, err := http.Get(tu.URL + "/readyz?verbose")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "spoe: no SPOE agent listens") {
			t.Errorf("/readyz?verbose does not name the missing agent:\n%s", b)
		}
	})

	t.Run("config decides", func(t *testing.T) {
		listen, agent := FreeAddr(t), FreeAddr(t)
		cfg := base(listen, fmt.Sprintf("listen: %s, spoe: %q", FreeAddr(t), agent))
		out, warned := renderTo(cfg)
		if warned {
			t.Error("render warned although haproxy.spoe decides")
		}
		spoe, err := os.ReadFile(filepath.Join(out, "haproxy.cfg"))
		if err != nil || !strings.Contains(string(spoe), agent) {
			t.Fatalf("rendered haproxy.cfg does not name %s: %v\n%s", agent, err, spoe)
		}
		tu := StartTurnout(t, listen, cfg) // no --haproxy-dir: the config decides
		Eventually(t, 10*time.Second, "the agent on "+agent, func() bool {
			c, err := net.DialTimeout("tcp", agent, time.Second)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		resp, err := http.Get(tu.URL + "/readyz?verbose")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "spoe:") {
			t.Errorf("/readyz?verbose names a missing agent while one listens:\n%s", b)
		}
		if log, _ := os.ReadFile(tu.Log); bytes.Contains(log, []byte("no SPOE agent listens")) {
			t.Errorf("warned about a missing agent while one listens:\n%s", log)
		}
	})
}

// TestRequestLogNginx: the same request log through nginx (body mode): a
// request routed to the good replica, one routed to a replica that refuses
// connections (nginx retries a POST on its fallback only when nothing was
// sent; turnout's health checks are off so it keeps picking it), and a
// refused one, each with its fields.
func TestRequestLogNginx(t *testing.T) {
	good := StartMock(t, "good", nil)
	logPath := filepath.Join(t.TempDir(), "requests.log")
	s := (&nstack{failMode: "open", noHealth: true, extraYAML: fmt.Sprintf("request_log: {sample: 1, to: file, file: %q}\n", logPath),
		deps: []ndep{{name: "llama", policy: "{name: round-robin}", mode: "body", mocks: []*Mock{good, {Name: "reset", Addr: FreeAddr(t)}}}}}).start(t)
	for i := range 4 {
		r := s.post(t, "/v1/chat/completions", chatBody("llama", "sys", "hello", false), map[string]string{"X-Session-Id": fmt.Sprint("s-", i)})
		if r.Status != 200 {
			t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
		}
	}
	if r := s.post(t, "/v1/chat/completions", chatBody("no-such-model", "sys", "hello", false), nil); r.Status != 404 {
		t.Fatalf("unknown model: %d", r.Status)
	}
	routed, failedOver, refused := waitRoutedFailedRefused(t, logPath)
	// turnout started first ("nginx is not running"), then says when it runs.
	Eventually(t, 10*time.Second, "the running line", func() bool {
		b, _ := os.ReadFile(s.T.Log)
		return bytes.Contains(b, []byte("nginx is not running")) && bytes.Contains(b, []byte("nginx running"))
	})
	for what, l := range map[string]map[string]any{"routed": routed, "failed over": failedOver} {
		for k, v := range map[string]any{"deployment": "llama", "model": "llama", "pool": "llama_mixed", "session": true, "status": 200.0, "served_by": "good"} {
			if l[k] != v {
				t.Errorf("%s: %s = %v, want %v", what, k, l[k], v)
			}
		}
	}
	if routed["retries"] != 0.0 {
		t.Errorf("routed: retries = %v, want 0", routed["retries"])
	}
	if r, _ := failedOver["retries"].(float64); r < 1 {
		t.Errorf("failed over: retries = %v, want >= 1", failedOver["retries"])
	}
	if refused["reason"] != "model_not_found" || refused["outcome"] != "refused" {
		t.Errorf("refused: %v", refused)
	}
}
