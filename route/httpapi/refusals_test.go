package httpapi

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
)

// Issue 28 item 4: every error answer turnout gives on its own is counted
// by status and reason: the body reader's 408, the HTTP layer's 400, a
// wrong method, and a decision's refusal.
func TestRefusalsCounted(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(limitsConfig, 64<<20))
	addr := serveHTTP(t, s)
	// A stalled body: 408 request_timeout.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 60000\r\n\r\n%s", contract.PathRoute, strings.Repeat(" ", 9000))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.ReadAll(c)
	// Malformed HTTP: 400 bad_request (fasthttp's error handler).
	if res := rawRequest(t, addr, "POST "+contract.PathRoute+" HTTP/1.1\r\nHost: t\r\nContent-Length: x", nil); res.StatusCode != 400 {
		t.Fatalf("malformed request: %d", res.StatusCode)
	}
	// A wrong method: 405.
	if res := rawRequest(t, addr, "GET "+contract.PathRoute+" HTTP/1.1\r\nHost: t", nil); res.StatusCode != 405 {
		t.Fatalf("GET: %d", res.StatusCode)
	}
	// A decision refused: unknown model, 404.
	body := `{"model":"nope","messages":[]}`
	if res := rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d", contract.PathRoute, len(body)), []byte(body)); res.StatusCode != 404 {
		t.Fatalf("unknown model: %d", res.StatusCode)
	}
	res, err := http.Get("http://" + addr + contract.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	text := readAll(res)
	for _, want := range []string{
		`turnout_refusals_total{status="408",reason="request_timeout"} 1`,
		`turnout_refusals_total{status="400",reason="bad_request"} 1`,
		`turnout_refusals_total{status="405",reason="method_not_allowed"} 1`,
		`turnout_refusals_total{status="404",reason="model_not_found"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(text, "turnout_refusals_total"))
		}
	}
}

func grepLines(text, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
