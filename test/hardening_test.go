//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Issue 16 checks shared by the HAProxy and nginx suites.

// proxyURL is the frontend's base URL.
func proxyURL(f frontend) string {
	switch s := f.(type) {
	case *hstack:
		return s.H.URL
	case *nstack:
		return s.N.URL
	}
	panic("unknown frontend")
}

// rawHTTP sends one request exactly as written (no client-side path
// cleaning) and returns the status and the X-Replica header.
func rawHTTP(t *testing.T, base, method, path string, body []byte, hdr map[string]string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: turnout-test\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", method, path, len(body))
	for k, v := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	b.Write(body)
	if _, err := c.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode, res.Header.Get("X-Replica")
}

// Issue 16 finding 7: dot segments and encoded slashes cannot walk out of
// /v1/ (a replica resolving "/v1/../metrics" served its /metrics); issue
// 42: the engines' admin routes under /v1/ are refused too.
func checkPathGuard(t *testing.T, f frontend, model string, extra map[string]string) {
	base := proxyURL(f)
	for _, p := range []string{"/v1/../metrics", "/v1/%2e%2e/metrics", "/v1/%2E./metrics", "/v1/./../metrics",
		"/v1/..%2fmetrics", "/v1//../metrics", "/v1/chat/../../metrics", "/v1/..",
		// The engines' admin routes under /v1/ (proxy.expose_admin_paths):
		// a client must not load or unload adapters for everyone.
		"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter?x=1", "/v1/LOAD_LORA_ADAPTER",
		// vLLM's admin routes outside /v1/ (api_server.py): refused as
		// every path outside /v1/ is, whatever expose_admin_paths says.
		"/reset_prefix_cache", "/reset_mm_cache", "/sleep?level=1", "/wake_up", "/is_sleeping", "/start_profile",
		"/stop_profile", "/collective_rpc", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/server_info",
		"/v1/../sleep", "/v1/%2e%2e/wake_up"} {
		for _, m := range []string{"GET", "POST"} {
			st, replica := rawHTTP(t, base, m, p, chatBody(model, "s", "u", false), extra)
			if st != 404 || replica != "" {
				t.Errorf("%s %s: %d, replica %q; want 404 from the proxy", m, p, st, replica)
			}
		}
	}
	// The guard leaves ordinary paths alone.
	if st, replica := rawHTTP(t, base, "POST", "/v1/chat/completions", chatBody(model, "s", "u", false), extra); st != 200 || replica == "" {
		t.Errorf("POST /v1/chat/completions: %d replica %q", st, replica)
	}
}

// Issue 16 finding 7: a client's X-Original-*, X-Body-Truncated and any
// X-Turnout-* header reach neither turnout's decision nor a replica.
func checkClientInputsStripped(t *testing.T, f frontend, model string, extra map[string]string) {
	for _, m := range f.replicas(model) {
		res, err := http.Post("http://"+m.Addr+"/mock/requests/clear", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	hdr := map[string]string{
		"X-Original-URI": "/evil", "X-Original-Method": "DELETE", "X-Original-Forwarded-For": "10.0.0.1",
		"X-Body-Truncated": "1/999999", "X-Turnout-Anything": "x", "X-Turnout-Server": "nope", "X-Turnout-Prefill-Whatever": "y",
	}
	for k, v := range extra {
		hdr[k] = v
	}
	for i := range 5 {
		r := f.post(t, "/v1/chat/completions", chatBody(model, "s", fmt.Sprint("strip", i), false), hdr)
		if r.Status != 200 || r.Header.Get("X-Replica") == "" {
			t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
		}
	}
	seen := 0
	for _, m := range f.replicas(model) {
		res, err := http.Get("http://" + m.Addr + "/mock/requests")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		low := strings.ToLower(string(b))
		seen += strings.Count(low, "strip")
		for _, h := range []string{"x-original-", "x-body-truncated", "x-turnout-"} {
			if strings.Contains(low, h) {
				t.Errorf("replica %s received a client's %s* header", m.Name, h)
			}
		}
	}
	if seen == 0 {
		t.Fatal("the replicas' request logs hold none of the test requests")
	}
}

// Issue 16 finding 3: routing headers up to 16 KiB are routed by turnout;
// a head over turnout's limit (32 KiB) fails open, not a client 400.
func checkLargeHeaders(t *testing.T, f frontend, model string, extra map[string]string) {
	hdr := map[string]string{"X-Session-Id": strings.Repeat("s", 16<<10)}
	for k, v := range extra {
		hdr[k] = v
	}
	var first string
	for i := range 3 {
		r := f.post(t, "/v1/chat/completions", chatBody(model, "s", fmt.Sprint("big", i), false), hdr)
		if r.Status != 200 || r.Header.Get("X-Replica") == "" {
			t.Fatalf("16 KiB session header, request %d: %d %s", i, r.Status, r.Body)
		}
		if i == 0 {
			first = r.Header.Get("X-Replica")
		} else if got := r.Header.Get("X-Replica"); got != first {
			t.Errorf("16 KiB session header: request %d on %s, the first on %s (not routed by session)", i, got, first)
		}
	}
	hdr["X-Session-Id"] = strings.Repeat("s", 20<<10)
	hdr["X-Request-Id"] = strings.Repeat("r", 20<<10)
	r := f.post(t, "/v1/chat/completions", chatBody(model, "s", "bigger", false), hdr)
	if r.Status != 200 || r.Header.Get("X-Replica") == "" {
		t.Errorf("40 KiB of routing headers (over turnout's limit): %d reason %q %s; want fail-open service",
			r.Status, r.Header.Get("X-Turnout-Reason"), r.Body)
	}
}

// Issue 16 finding 8: turnout's answer echoing a 5,000-byte model name
// reaches the client as a JSON 404 (nginx dropped the connection on answers
// over its 4 KiB subrequest buffer).
func checkLongModelRefused(t *testing.T, f frontend, extra map[string]string) {
	r := f.post(t, "/v1/chat/completions", chatBody(strings.Repeat("m", 5000), "s", "u", false), extra)
	if r.Status != 404 || !strings.Contains(string(r.Body), "model_not_found") || r.Header.Get("X-Replica") != "" {
		t.Errorf("5,000-byte model name: %d %.200s", r.Status, r.Body)
	}
}
