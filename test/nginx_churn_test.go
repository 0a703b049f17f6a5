//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/nginx"
)

// ngStream posts a streamed chat request of tokens tokens and reads it to
// the end: "" when every token and [DONE] arrived, else what went wrong.
func ngStream(c *http.Client, url, model string, hdr map[string]string, tokens int) string {
	_, msg := ngTry(c, url, model, hdr, true, tokens)
	return msg
}

// ngClients runs n clients until stop closes, the even ones on the body-mode
// deployment "bdy", the odd ones on the header-mode "hdr" (named by
// X-Model); fn makes client w's i-th request.
func ngClients(stop <-chan struct{}, n int, fn func(w, i int, model string, h map[string]string)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model, h := "bdy", map[string]string(nil)
			if w%2 == 1 {
				model, h = "hdr", map[string]string{"X-Model": "hdr"}
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				fn(w, i, model, h)
			}
		}()
	}
	return &wg
}

// Issue 28 item 7: replicas added and removed again and again under a
// streaming load (2 s streams and short requests, header and body mode):
// nginx is never reloaded (the same master and workers, nginx.conf not
// rewritten, no "reloading nginx" in turnout's log) and no request fails.
// Added replicas get traffic as soon as turnout knows them, removed ones
// none once turnout dropped them. With a reload per change (408fc92) the
// same test lost 3 of 291 requests ("server closed idle connection").
func TestNginxChurnNoReload(t *testing.T) {
	const cycles, streamTokens = 8, 20 // 20 tokens x 100 ms: 2 s streams
	body := mocks(t, "cb", 4, ngSlowStream)
	hdr := mocks(t, "ch", 4, ngSlowStream)
	s := startNginxStack(t, "open",
		ndep{name: "bdy", policy: policyLeast, mode: "body", mocks: body[:2]},
		ndep{name: "hdr", policy: policyLeast, mode: "header", mocks: hdr[:2]},
	)
	confPath := filepath.Join(s.dir, nginx.ConfigFile)
	conf0, err := os.ReadFile(confPath)
	if err != nil {
		t.Fatal(err)
	}
	// worker_processes auto: the master forks them one by one.
	master, workers := s.N.Cmd.Process.Pid, s.N.Workers()
	Eventually(t, 5*time.Second, "nginx workers to settle", func() bool {
		time.Sleep(300 * time.Millisecond)
		now := s.N.Workers()
		settled := len(now) > 0 && slices.Equal(now, workers)
		workers = now
		return settled
	})
	// applied counts the configs turnout loaded (and synced nginx with).
	applied := func() int {
		b, _ := os.ReadFile(s.T.Log)
		return strings.Count(string(b), `"message":"config reloaded"`)
	}

	stop := make(chan struct{})
	var okN, streams, failN atomic.Int64
	var errMu sync.Mutex
	var errs []string
	fail := func(msg string) {
		failN.Add(1)
		errMu.Lock()
		if len(errs) < 20 {
			errs = append(errs, msg)
		}
		errMu.Unlock()
	}
	c := &http.Client{Timeout: 30 * time.Second}
	wg := ngClients(stop, 8, func(w, i int, model string, h map[string]string) {
		if w < 4 { // half the clients stream
			if msg := ngStream(c, s.N.URL, model, h, streamTokens); msg != "" {
				fail(model + ": " + msg)
				return
			}
			streams.Add(1)
			okN.Add(1)
			return
		}
		r, err := Post(t.Context(), c, s.N.URL+"/v1/chat/completions", chatBody(model, "churn", fmt.Sprintf("w%d-%d", w, i), false), h)
		switch {
		case err != nil:
			fail(model + ": " + err.Error())
		case r.Status != 200:
			fail(fmt.Sprintf("%s: %d %s", model, r.Status, r.Body))
		default:
			okN.Add(1)
		}
	})
	hardStop := time.AfterFunc(60*time.Second, func() { close(stop) })
	defer hardStop.Stop()

	// Each cycle swaps the second replica of both pools (the first stays:
	// a pool left with none of the servers nginx loaded would reload).
	time.Sleep(500 * time.Millisecond)
	for i := range cycles {
		next := 1 + (i+1)%3
		s.dep("bdy").mocks = []*Mock{body[0], body[next]}
		s.dep("hdr").mocks = []*Mock{hdr[0], hdr[next]}
		before := applied()
		s.T.Rewrite(t, s.yaml())
		Eventually(t, 10*time.Second, fmt.Sprintf("turnout to load cycle %d", i), func() bool { return applied() > before })
		time.Sleep(700 * time.Millisecond) // load on this membership
	}
	// The last membership: body[0], body[3] (and hdr alike). body[1] and
	// body[2] were removed once turnout logged it, and get nothing new.
	removed := []*Mock{body[1], body[2], hdr[1], hdr[2]}
	counts := make([]int64, len(removed))
	for i, m := range removed {
		counts[i] = m.Stats().Requests
	}
	time.Sleep(1500 * time.Millisecond)
	if hardStop.Stop() {
		close(stop)
	}
	wg.Wait()

	if failN.Load() != 0 || okN.Load() == 0 {
		t.Errorf("churn: %d ok, %d failed; want no failures: %v", okN.Load(), failN.Load(), errs)
	}
	for _, m := range slices.Concat(body, hdr) {
		if m.Stats().Requests == 0 {
			t.Errorf("replica %s got no traffic while it was a member", m.Name)
		}
	}
	for i, m := range removed {
		if n := m.Stats().Requests; n != counts[i] {
			t.Errorf("removed replica %s got %d requests after turnout dropped it", m.Name, n-counts[i])
		}
	}
	if s.N.Exited() || s.N.Cmd.Process.Pid != master {
		t.Errorf("nginx master %d exited", master)
	}
	if now := s.N.Workers(); !slices.Equal(now, workers) {
		t.Errorf("nginx workers %v -> %v: nginx was reloaded", workers, now)
	}
	if b, _ := os.ReadFile(confPath); !bytes.Equal(b, conf0) {
		t.Error("nginx.conf was rewritten")
	}
	tl, _ := os.ReadFile(s.T.Log)
	if n := strings.Count(string(tl), "reloading nginx"); n != 0 {
		t.Errorf("turnout reloaded nginx %d times", n)
	}
	t.Logf("churn: %d membership changes, %d requests served (%d 2 s streams), %d failed; master %d, workers %v before, %v after",
		cycles, okN.Load(), streams.Load(), failN.Load(), master, workers, s.N.Workers())
}
