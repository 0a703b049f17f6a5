//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/nginx"
)

// Issue 16 findings 5, 6 and 9 end to end: lost feedback is noticed, the
// feedback token travels through the real proxies' log formats and forged
// lines close nothing, a stalled replica is taken out.

const e2eToken = "e2e-feedback-token-0123456789"

func getBody(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func metricOr0(t *testing.T, url, name string, filters ...string) float64 {
	v, _ := Metric(t, url, name, filters...)
	return v
}

// routeOnce asks turnout directly and returns the decision id.
func routeOnce(t *testing.T, turnoutURL string) string {
	t.Helper()
	r, err := Post(context.Background(), http.DefaultClient, turnoutURL+"/internal/route", []byte(`{"model":"llama","prompt":"x"}`), nil)
	if err != nil || r.Status != 200 {
		t.Fatalf("route: %v %+v", err, r)
	}
	return r.Header.Get("X-Turnout-Decision")
}

func sendUDP(t *testing.T, addr, line string) {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
}

// Finding 5: completions stop while decisions are made -> a warning in the
// log, turnout_feedback_stalled 1 and a /readyz?verbose line, /readyz stays 200.
func TestFeedbackLossNoticed(t *testing.T) {
	addr, fb := FreeAddr(t), FreeUDPAddr(t)
	cfg := fmt.Sprintf(`listen: %s
health: {disable: true}
feedback: {syslog: %s, stalled_after: 1s, stalled_min_decisions: 5}
deployments:
  - name: llama
    pools: [{role: mixed, endpoints: [{name: a, address: "127.0.0.1:9101"}, {name: b, address: "127.0.0.1:9102"}]}]
`, addr, fb)
	tu := StartTurnout(t, addr, cfg, "--watch", "0")
	// Feedback is authenticated by default: the token turnout created.
	tok := tu.FeedbackToken(t)
	if tok == "" {
		t.Fatal("no feedback token created beside the config")
	}
	// Feedback works at first...
	id := routeOnce(t, tu.URL)
	Eventually(t, 5*time.Second, "the first completion", func() bool {
		sendUDP(t, fb, "<134>haproxy[1]: turnout-done id="+id+" srv=a status=200 ms=3 ttfb=1 tok="+tok)
		return metricOr0(t, tu.URL+"/metrics", "turnout_completions_total", `result="completed"`) == 1
	})
	Eventually(t, 5*time.Second, "feedback ok in /readyz?verbose", func() bool {
		return strings.Contains(getBody(t, tu.URL+"/readyz?verbose"), "feedback: ok")
	})
	// ...then stops while decisions go on.
	var open []string
	for range 8 {
		open = append(open, routeOnce(t, tu.URL))
	}
	defer func() {
		if t.Failed() {
			t.Logf("readyz: %s\nmetrics: %s", getBody(t, tu.URL+"/readyz?verbose"), getBody(t, tu.URL+"/metrics"))
		}
	}()
	Eventually(t, 10*time.Second, "turnout_feedback_stalled 1", func() bool {
		return metricOr0(t, tu.URL+"/metrics", "turnout_feedback_stalled") == 1
	})
	res, err := http.Get(tu.URL + "/readyz?verbose")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), "feedback: STALLED") {
		t.Fatalf("/readyz?verbose %d:\n%s", res.StatusCode, b)
	}
	Eventually(t, 5*time.Second, "the warning in the log", func() bool {
		l, _ := os.ReadFile(tu.Log)
		return strings.Contains(string(l), "completion feedback stopped")
	})
	sendUDP(t, fb, "turnout-done id="+open[0]+" srv=b status=200 ms=3 ttfb=1 tok="+tok)
	Eventually(t, 5*time.Second, "turnout_feedback_stalled 0 after a completion", func() bool {
		return metricOr0(t, tu.URL+"/metrics", "turnout_feedback_stalled") == 0
	})
}

// checkTokenFlow: with feedback.token rendered into the proxy's log format,
// proxied requests close their decisions and fill the per-endpoint metrics;
// a forged line without the token (even from loopback) and /internal/done
// without it close nothing.
func checkTokenFlow(t *testing.T, turnoutURL, syslog string, send func() int) {
	completed := func() float64 {
		return metricOr0(t, turnoutURL+"/metrics", "turnout_completions_total", `result="completed"`)
	}
	// The proxy reloads with the token: wait until its lines are accepted.
	Eventually(t, 30*time.Second, "a proxied request to close its decision", func() bool {
		before := completed()
		if st := send(); st != 200 {
			t.Logf("status %d", st)
			return false
		}
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			if completed() > before {
				return true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	})
	if v := metricOr0(t, turnoutURL+"/metrics", "turnout_endpoint_responses_total", `class="2xx"`); v < 1 {
		t.Fatalf("no 2xx in turnout_endpoint_responses_total from the proxy's lines")
	}
	if v := metricOr0(t, turnoutURL+"/metrics", "turnout_endpoint_ttfb_seconds_count"); v < 1 {
		t.Fatalf("no ttfb= parsed from the proxy's lines")
	}
	id := routeOnce(t, turnoutURL)
	inflight := metricOr0(t, turnoutURL+"/metrics", "turnout_endpoint_inflight")
	rejected := metricOr0(t, turnoutURL+"/metrics", "turnout_feedback_rejected_total")
	// UDP may drop a datagram on a busy host: resend until one is counted.
	Eventually(t, 10*time.Second, "the forged line to be rejected", func() bool {
		sendUDP(t, syslog, "<134>haproxy[1]: turnout-done id="+id+" srv=x status=200 ms=1")
		time.Sleep(100 * time.Millisecond)
		return metricOr0(t, turnoutURL+"/metrics", "turnout_feedback_rejected_total") > rejected
	})
	r, err := Post(context.Background(), http.DefaultClient, turnoutURL+"/internal/done?id="+id, nil, nil)
	if err != nil || r.Status != 403 {
		t.Fatalf("/internal/done without the token: %v %+v", err, r)
	}
	if v := metricOr0(t, turnoutURL+"/metrics", "turnout_endpoint_inflight"); v != inflight {
		t.Fatalf("forged completions changed inflight %v -> %v", inflight, v)
	}
	r, err = Post(context.Background(), http.DefaultClient, turnoutURL+"/internal/done?id="+id, nil, map[string]string{"X-Turnout-Token": e2eToken})
	if err != nil || r.Status != 204 {
		t.Fatalf("/internal/done with the token: %v %+v", err, r)
	}
}

func TestHAProxyFeedbackToken(t *testing.T) {
	s := startStack(t, "open", depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "tok", 2, nil)})
	s.T.Rewrite(t, strings.Replace(s.yaml(), "feedback: {syslog: "+s.syslog+"}", "feedback: {syslog: "+s.syslog+", token: "+e2eToken+"}", 1))
	Eventually(t, 20*time.Second, "haproxy.cfg with the token", func() bool {
		b, _ := os.ReadFile(filepath.Join(s.dir, "haproxy.cfg"))
		return strings.Contains(string(b), "tok="+e2eToken)
	})
	checkTokenFlow(t, s.T.URL, s.syslog, func() int {
		r, err := Post(context.Background(), s.client, s.H.URL+"/v1/chat/completions", chatBody("llama", "s", "u", false), nil)
		if err != nil {
			return 0
		}
		return r.Status
	})
}

func TestNginxFeedbackToken(t *testing.T) {
	s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "body", mocks: mocks(t, "ntok", 2, nil)})
	s.T.Rewrite(t, strings.Replace(s.yaml(), "feedback: {syslog: "+s.syslog+"}", "feedback: {syslog: "+s.syslog+", token: "+e2eToken+"}", 1))
	// Until turnout applies the token, a forged line is still accepted.
	Eventually(t, 20*time.Second, "nginx.conf with the token", func() bool {
		b, _ := os.ReadFile(filepath.Join(s.dir, nginx.ConfigFile))
		return strings.Contains(string(b), "tok="+e2eToken)
	})
	checkTokenFlow(t, s.T.URL, s.syslog, func() int {
		r, err := Post(context.Background(), s.client, s.N.URL+"/v1/chat/completions", chatBody("llama", "s", "u", false), nil)
		if err != nil {
			return 0
		}
		return r.Status
	})
}

// Finding 9: a replica that accepts requests and stalls is taken out
// (turnout_endpoint_degraded 1, no new requests) within about twice its
// budget, and comes back once it answers again. Through HAProxy, with
// steady traffic.
func TestHAProxyStalledReplicaTakenOut(t *testing.T) {
	const budget = 2 * time.Second
	ms := mocks(t, "stall", 3, nil)
	s := startStack(t, "open", depSpec{name: "llama", policy: policyLeast, mocks: ms})
	s.T.Rewrite(t, strings.Replace(s.yaml(), "health: {interval: 300ms, timeout: 300ms}",
		fmt.Sprintf("health: {interval: 300ms, timeout: 300ms, stall: {budget: %s}}", budget), 1))
	Eventually(t, 10*time.Second, "the stall budget to apply", func() bool {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_config_reloads_total", `result="ok"`) >= 2
	})
	client := &http.Client{Timeout: 60 * time.Second}
	var (
		mu       sync.Mutex
		served   = map[string]int{} // replica -> responses to requests sent after `mark`
		mark     atomic.Int64
		failures atomic.Int64
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	go func() { // ~25 req/s until stop
		tk := time.NewTicker(40 * time.Millisecond)
		defer tk.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent := time.Now().UnixNano()
				r, err := Post(context.Background(), client, s.H.URL+"/v1/chat/completions", chatBody("llama", "s", fmt.Sprint(i), false), nil)
				if err != nil || r.Status != 200 {
					failures.Add(1)
					return
				}
				if m := mark.Load(); m != 0 && sent > m {
					mu.Lock()
					served[r.Header.Get(mock.HeaderReplica)]++
					mu.Unlock()
				}
			}()
		}
	}()
	defer func() {
		close(stop)
		for _, m := range ms {
			_ = m.SetFaults(mock.Faults{})
		}
		wg.Wait()
	}()
	time.Sleep(time.Second) // completions flowing
	stalled := ms[0]
	took, degraded := stallUntilDegraded(t, s, stalled, 10*time.Second, 5*budget, "")
	t.Logf("stalled replica taken out %v after it began stalling (budget %v, %.2fx)", took.Round(10*time.Millisecond), budget, took.Seconds()/budget.Seconds())
	mark.Store(time.Now().UnixNano())
	time.Sleep(3 * time.Second)
	mu.Lock()
	got := fmt.Sprint(served)
	n, bad := 0, served[stalled.Name]
	for _, v := range served {
		n += v
	}
	mu.Unlock()
	if n < 20 || bad > 0 {
		t.Fatalf("after degrading: served %s, want >= 20 and none by %s", got, stalled.Name)
	}
	if !strings.Contains(getBody(t, s.T.URL+"/readyz?verbose"), "endpoint "+stalled.Name) {
		t.Errorf("/readyz?verbose does not list the degraded endpoint")
	}
	_ = stalled.SetFaults(mock.Faults{})
	Eventually(t, 4*budget, stalled.Name+" readmitted", func() bool { return degraded() == 0 })
	if f := failures.Load(); f != 0 {
		t.Errorf("%d requests failed", f)
	}
	if took > 2*budget+budget/2 {
		t.Errorf("took %v to take the stalled replica out, goal <= 2x the %v budget", took, budget)
	}
}

// stallUntilDegraded stalls replica stalled for stall and waits up to
// within for turnout to mark it degraded; it returns how long that took
// and a reader of its turnout_endpoint_degraded gauge.
func stallUntilDegraded(t *testing.T, s *hstack, stalled *Mock, stall, within time.Duration, what string) (time.Duration, func() float64) {
	t.Helper()
	start := time.Now()
	if err := stalled.SetFaults(mock.Faults{Stall: stall}); err != nil {
		t.Fatal(err)
	}
	degraded := func() float64 {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_endpoint_degraded", `endpoint="`+stalled.Name+`"`)
	}
	Eventually(t, within, strings.TrimSpace(stalled.Name+" degraded "+what), func() bool { return degraded() == 1 })
	return time.Since(start), degraded
}
