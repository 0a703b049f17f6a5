//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With haproxy.feedback: ring, HAProxy's completion lines travel through
// its ring over TCP. They close turnout's decisions; with
// turnout killed, requests are still served (fail-open) and the ring holds
// the lines; a restarted turnout gets the connection back without a reload
// of HAProxy, and its decisions close again.
func TestHAProxyFeedbackRing(t *testing.T) {
	ms := mocks(t, "ring", 2, nil)
	s := startStackHA(t, "open", spoeDefault, ", feedback: ring", depSpec{name: "llama", policy: policyLeast, mocks: ms})
	cfg, err := os.ReadFile(filepath.Join(s.dir, "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), "log ring@turnout_feedback") || !strings.Contains(string(cfg), "server turnout "+s.syslog+" log-proto octet-count") {
		t.Fatalf("the render does not send feedback through the ring to %s:\n%s", s.syslog, cfg)
	}
	s.H.WaitServersUp(t, "turnout_spoe/agent0")
	completed := func(tu *Turnout) float64 {
		return metricOr0(t, tu.URL+"/metrics", "turnout_completions_total", `result="completed"`)
	}
	// The ring connects on its own schedule after HAProxy starts, and
	// HAProxy 2.6 may drop lines written before that: requests until one
	// closes, then count.
	Eventually(t, 30*time.Second, "the ring connected: a decision closed through it", func() bool {
		if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", "first", false), nil); r.Status != 200 {
			t.Fatalf("proxied request: %d %s", r.Status, r.Body)
		}
		return completed(s.T) > 0
	})
	const n = 20
	base := completed(s.T)
	for i := range n {
		if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", fmt.Sprint(i), false), nil); r.Status != 200 {
			t.Fatalf("proxied request: %d %s", r.Status, r.Body)
		}
	}
	defer func() {
		if t.Failed() {
			ev, _ := s.H.Cmd1(t, "show events turnout_feedback")
			t.Logf("HAProxy's ring:\n%s\nturnout's feedback counters: %v lines, %v malformed, %v rejected", ev,
				metricOr0(t, s.T.URL+"/metrics", "turnout_feedback_lines_total", `result="ok"`),
				metricOr0(t, s.T.URL+"/metrics", "turnout_feedback_lines_total", `result="malformed"`),
				metricOr0(t, s.T.URL+"/metrics", "turnout_feedback_rejected_total"))
		}
	}()
	start := time.Now()
	Eventually(t, 30*time.Second, "every decision closed by a line from the ring", func() bool { return completed(s.T) >= base+n })
	t.Logf("%v completions %v after the last request", completed(s.T), time.Since(start).Round(10*time.Millisecond))

	// turnout killed: requests are served without it, their lines wait in the ring.
	_ = s.T.Cmd.Process.Signal(syscall.SIGKILL)
	_ = s.T.Cmd.Wait()
	for i := range n {
		if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", fmt.Sprint("down", i), false), nil); r.Status != 200 {
			t.Fatalf("request with turnout down: %d %s", r.Status, r.Body)
		}
	}
	back := time.Now()
	tu := StartTurnout(t, s.turnoutAddr, s.yaml(), "--haproxy-dir", s.dir, "--watch", "100ms")
	s.H.WaitServersUp(t, "turnout_spoe/agent0")
	// The ring reconnects on its own schedule: requests until one closes.
	Eventually(t, 30*time.Second, "a decision of the restarted turnout closed through the ring", func() bool {
		if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", "back", false), nil); r.Status != 200 {
			t.Fatalf("request after the restart: %d %s", r.Status, r.Body)
		}
		return completed(tu) > 0
	})
	t.Logf("feedback back %v after turnout restarted", time.Since(back).Round(10*time.Millisecond))
}
