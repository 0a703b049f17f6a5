//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loadGen posts chat requests through the proxy until stopped and counts
// the answers that are not 200 (with fail_mode closed, every request turnout
// cannot decide is a 503).
type loadGen struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	ok, bad  atomic.Int64
	mu       sync.Mutex
	failures []string
}

func startLoad(t *testing.T, url, model string, workers int) *loadGen {
	// Keep-alive clients: a proxy reload must not close an idle connection
	// under a request (HAProxy option idle-close-on-response).
	return startLoadWith(t, url, model, workers, &http.Transport{MaxIdleConnsPerHost: workers}, nil)
}

func startLoadWith(t *testing.T, url, model string, workers int, tr *http.Transport, hdr map[string]string) *loadGen {
	g := &loadGen{stop: make(chan struct{})}
	c := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	for w := range workers {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-g.stop:
					return
				default:
				}
				r, err := Post(context.Background(), c, url+"/v1/chat/completions", chatBody(model, "load", fmt.Sprintf("w%d-%d", w, i), i%4 == 0), hdr)
				if err == nil && r.Status == 200 {
					g.ok.Add(1)
					continue
				}
				g.bad.Add(1)
				g.mu.Lock()
				if len(g.failures) < 5 {
					if err != nil {
						g.failures = append(g.failures, err.Error())
					} else {
						g.failures = append(g.failures, fmt.Sprintf("%d %s %s", r.Status, r.Header.Get("X-Turnout-Reason"), r.Body))
					}
				}
				g.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	t.Cleanup(g.end)
	return g
}

func (g *loadGen) end() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	g.wg.Wait()
}

// check ends the load and fails the test on any failed request.
func (g *loadGen) check(t *testing.T, what string) {
	t.Helper()
	g.end()
	t.Logf("%s: %d ok, %d failed", what, g.ok.Load(), g.bad.Load())
	if g.bad.Load() != 0 || g.ok.Load() == 0 {
		t.Errorf("%s: %d ok, %d failed, want 0 failed; first failures: %q", what, g.ok.Load(), g.bad.Load(), g.failures)
	}
}

func haproxyCfg(t *testing.T, s *hstack) string {
	b, err := os.ReadFile(filepath.Join(s.dir, "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func refuses(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return true
	}
	c.Close()
	return false
}

// Issue 16 finding 1: a live change of listen, haproxy.spoe or
// feedback.syslog is applied (listeners reopened, then the proxy moved, then
// the old listener closed), with fail_mode closed and no failed request;
// a change to an address turnout cannot bind is rejected with the field
// named, the old listeners keep serving and HAProxy is not reloaded.
func TestLiveReloadListeners(t *testing.T) {
	ms := mocks(t, "lr", 3, nil)
	s := startStack(t, "closed", depSpec{name: "llama", policy: policyLeast, mocks: ms})

	t.Run("Listen", func(t *testing.T) {
		old := s.turnoutAddr
		g := startLoad(t, s.H.URL, "llama", 3)
		time.Sleep(300 * time.Millisecond)
		s.turnoutAddr = FreeAddr(t)
		s.T.Rewrite(t, s.yaml())
		Eventually(t, 10*time.Second, "HAProxy to call turnout at the new listen address", func() bool {
			return strings.Contains(haproxyCfg(t, s), s.turnoutAddr) && !refuses(s.turnoutAddr)
		})
		WaitHTTP(t, "http://"+s.turnoutAddr+"/healthz", 5*time.Second)
		Eventually(t, 15*time.Second, "the old listener to close after its grace", func() bool { return refuses(old) })
		time.Sleep(300 * time.Millisecond)
		g.check(t, "listen change")
		s.T.URL = "http://" + s.turnoutAddr
	})

	t.Run("SPOEEnabledThenMoved", func(t *testing.T) {
		g := startLoad(t, s.H.URL, "llama", 3)
		time.Sleep(300 * time.Millisecond)
		s.spoeAddr = FreeAddr(t)
		s.T.Rewrite(t, s.yaml())
		Eventually(t, 10*time.Second, "HAProxy to ask turnout over SPOE", func() bool {
			return strings.Contains(haproxyCfg(t, s), s.spoeAddr)
		})
		s.H.WaitServersUp(t, "turnout_spoe/agent0")
		first := s.spoeAddr
		s.spoeAddr = FreeAddr(t)
		s.T.Rewrite(t, s.yaml())
		Eventually(t, 10*time.Second, "HAProxy to use the moved SPOE address", func() bool {
			return strings.Contains(haproxyCfg(t, s), s.spoeAddr)
		})
		Eventually(t, 15*time.Second, "the old SPOE listener to close", func() bool { return refuses(first) })
		time.Sleep(300 * time.Millisecond)
		g.check(t, "SPOE enabled, then moved")
	})

	t.Run("Feedback", func(t *testing.T) {
		s.syslog = FreeUDPAddr(t)
		s.T.Rewrite(t, s.yaml())
		Eventually(t, 10*time.Second, "HAProxy to log to the new feedback address", func() bool {
			return strings.Contains(haproxyCfg(t, s), "log "+s.syslog)
		})
		time.Sleep(500 * time.Millisecond) // the old worker finishes
		g := startLoad(t, s.H.URL, "llama", 3)
		time.Sleep(time.Second)
		g.check(t, "after a feedback change")
		// Every decision closes through the new feedback socket.
		Eventually(t, 10*time.Second, "turnout_endpoint_inflight to return to 0", func() bool {
			v, err := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_inflight")
			return err == nil && v == 0
		})
	})

	t.Run("BusyAddressRejected", func(t *testing.T) {
		busy, err := net.Listen("tcp", FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		pid := s.H.Info(t)["Pid"]
		cfgBefore := haproxyCfg(t, s)
		before, _ := Metric(t, s.T.URL+"/metrics", "turnout_config_reloads_total", `result="rejected"`)
		good := s.turnoutAddr
		s.turnoutAddr = busy.Addr().String()
		s.T.Rewrite(t, s.yaml())
		Eventually(t, 5*time.Second, "the config to be rejected", func() bool {
			v, _ := Metric(t, "http://"+good+"/metrics", "turnout_config_reloads_total", `result="rejected"`)
			return v == before+1
		})
		log, _ := os.ReadFile(s.T.Log)
		if !strings.Contains(string(log), "listen: listen tcp "+s.turnoutAddr) {
			t.Errorf("the rejection does not name the field and address; log tail:\n%s", tail(string(log), 2000))
		}
		time.Sleep(time.Second) // a sync, if any, would have happened
		if got := s.H.Info(t)["Pid"]; got != pid {
			t.Errorf("HAProxy reloaded (pid %s -> %s) toward an address turnout does not serve", pid, got)
		}
		if haproxyCfg(t, s) != cfgBefore {
			t.Error("haproxy.cfg was rewritten for a rejected config")
		}
		s.turnoutAddr = good
		if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", "after", false), nil); r.Status != 200 {
			t.Errorf("after the rejected change: %d %s", r.Status, r.Body)
		}
	})
}

// TestLiveReloadListenNginx: the same listen change behind nginx (body and
// header mode), fail_mode closed. Clients open a connection per request: an
// nginx reload closes idle keep-alive connections (see docs/reliability.md).
func TestLiveReloadListenNginx(t *testing.T) {
	s := startNginxStack(t, "closed",
		ndep{name: "llama", policy: policyLeast, mode: "body", mocks: mocks(t, "nlb", 2, nil)},
		ndep{name: "chat", policy: policyLeast, mode: "header", mocks: mocks(t, "nlh", 2, nil)})
	old := s.turnoutAddr
	gb := startLoadWith(t, s.N.URL, "llama", 2, &http.Transport{DisableKeepAlives: true}, nil)
	gh := startLoadWith(t, s.N.URL, "chat", 2, &http.Transport{DisableKeepAlives: true}, map[string]string{"X-Model": "chat"})
	time.Sleep(300 * time.Millisecond)
	s.turnoutAddr = FreeAddr(t)
	s.T.Rewrite(t, s.yaml())
	Eventually(t, 10*time.Second, "nginx to call turnout at the new address", func() bool {
		b, err := os.ReadFile(filepath.Join(s.dir, "nginx.conf"))
		return err == nil && strings.Contains(string(b), s.turnoutAddr)
	})
	Eventually(t, 15*time.Second, "the old listener to close after its grace", func() bool { return refuses(old) })
	time.Sleep(300 * time.Millisecond)
	gb.check(t, "nginx body mode, listen change")
	gh.check(t, "nginx header mode, listen change")
	s.T.URL = "http://" + s.turnoutAddr
	Eventually(t, 10*time.Second, "turnout_endpoint_inflight to return to 0", func() bool {
		v, err := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
