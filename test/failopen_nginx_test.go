//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// failOpenStreamTTFB kills turnout (SIGKILL) and returns, for n streamed
// requests through the proxy after it (8 concurrent clients), the time to
// the response headers, in start order; it fails the test on any stream not
// served whole by a replica. With stop, turnout is stopped (SIGSTOP: its
// connections accepted by the kernel, never answered) instead of killed.
func failOpenStreamTTFB(t *testing.T, tu *Turnout, base, model string, extra map[string]string, n int, stop bool) []time.Duration {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	stream := func(user string) (time.Duration, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(chatBody(model, "s", user, true)))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range extra {
			req.Header.Set(k, v)
		}
		start := time.Now()
		res, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		ttfb := time.Since(start)
		if res.StatusCode != 200 || res.Header.Get("X-Replica") == "" {
			return 0, fmt.Sprintf("status %d from %q", res.StatusCode, res.Header.Get("X-Replica"))
		}
		done := false
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			done = done || sc.Text() == "data: [DONE]"
		}
		if !done {
			return 0, fmt.Sprintf("stream from %s ended without [DONE]: %v", res.Header.Get("X-Replica"), sc.Err())
		}
		return ttfb, ""
	}
	for range 20 { // warm: keep-alive connections to turnout open
		if _, msg := stream("warm"); msg != "" {
			t.Fatalf("turnout up: %s", msg)
		}
	}
	if stop {
		_ = tu.Cmd.Process.Signal(syscall.SIGSTOP)
		t.Cleanup(func() { _ = tu.Cmd.Process.Signal(syscall.SIGCONT) })
	} else {
		_ = tu.Cmd.Process.Signal(syscall.SIGKILL)
		<-tu.done
	}
	killed := time.Now()
	return killedLoad(t, killed, n, "stream", "time to headers", func() (time.Duration, string) { return stream("down") })
}

// Issue 28 item 1, nginx: with turnout SIGKILLed and fail_mode open,
// streamed requests (the issue saw 24-28% of them wait the whole 500 ms
// route_timeout through SPOE, for the whole outage) start streaming from
// the pool at once, in header and body mode: no stream's headers wait a
// route_timeout, and after the first 100 none waits even 400 ms.
func TestFailOpenDelayNginxStream(t *testing.T) {
	const n, routeTimeout, late = 1000, 500 * time.Millisecond, 400 * time.Millisecond
	check := func(t *testing.T, path string, d []time.Duration) {
		nSlow, p99, worst := summarize(d, 100*time.Millisecond)
		t.Logf("fail-open %s, streamed: %d/%d streams over 100ms to their headers after the kill; p99 %v, worst %v", path, nSlow, len(d), p99, worst)
		if worst >= routeTimeout {
			t.Errorf("%s: a stream waited %v for its headers (route_timeout %v)", path, worst, routeTimeout)
		}
		var lateAt []string
		for i, x := range d[100:] {
			if x > late {
				lateAt = append(lateAt, fmt.Sprintf("#%d %v", 100+i, x))
			}
		}
		if len(lateAt) > 0 {
			t.Errorf("%s: %d streams after the first 100 waited over %v for their headers (turnout dead the whole time): %s", path, len(lateAt), late, strings.Join(lateAt, ", "))
		}
	}
	t.Run("NginxBody", func(t *testing.T) {
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "body", mocks: mocks(t, "sb", 2, nil)})
		check(t, "nginx body", failOpenStreamTTFB(t, s.T, s.N.URL, "llama", nil, n, false))
	})
	// A prefill/decode deployment makes the body-mode route call's read
	// timeout its prefill budget (RouteCallTimeout): a dead turnout must
	// still cost nothing, and the stream comes from the decode pool.
	t.Run("NginxBodyPD", func(t *testing.T) {
		s := startNginxStack(t, "open", ndep{name: "pd", policy: policyLeast, mode: "body",
			prefill: mocks(t, "sp", 1, func(c *mock.Config) { c.Role = mock.RolePrefill }),
			decode:  mocks(t, "sd", 2, func(c *mock.Config) { c.Role = mock.RoleDecode })})
		check(t, "nginx body, prefill/decode", failOpenStreamTTFB(t, s.T, s.N.URL, "pd", nil, n, false))
	})
	t.Run("NginxHeader", func(t *testing.T) {
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "header", mocks: mocks(t, "sh", 2, nil)})
		check(t, "nginx header", failOpenStreamTTFB(t, s.T, s.N.URL, "llama", map[string]string{"X-Model": "llama"}, n, false))
	})
}

// A turnout that hangs (SIGSTOP) instead of dying: the route call waits
// route_timeout until the breaker (breaker_failures per turnout entry, per
// worker) sends nginx straight to the fail mode for breaker_cooldown. A
// stream waits one route_timeout at most, and only the first few do.
func TestFailOpenDelayNginxStreamHung(t *testing.T) {
	const n, routeTimeout = 400, 500 * time.Millisecond
	for _, c := range []struct {
		name, mode string
		hdr        map[string]string
	}{{"NginxBody", "body", nil}, {"NginxHeader", "header", map[string]string{"X-Model": "llama"}}} {
		t.Run(c.name, func(t *testing.T) {
			s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: c.mode, mocks: mocks(t, "hs"+c.mode[:1], 2, nil)})
			d := failOpenStreamTTFB(t, s.T, s.N.URL, "llama", c.hdr, n, true)
			nSlow, p99, worst := summarize(d, 100*time.Millisecond)
			t.Logf("fail-open nginx %s, turnout hung, streamed: %d/%d streams over 100ms to their headers; p99 %v, worst %v", c.mode, nSlow, len(d), p99, worst)
			if worst > routeTimeout+400*time.Millisecond {
				t.Errorf("a stream waited %v for its headers: more than one route_timeout (%v)", worst, routeTimeout)
			}
			// 2 workers x 2 turnout entries x breaker_failures 3, and the
			// 8 clients' requests in flight while the breaker counts.
			if nSlow > 40 {
				t.Errorf("%d streams waited over 100ms: the breaker did not open", nSlow)
			}
		})
	}
}
