//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// backendRetries reads a backend's retry and redispatch counters
// (show stat: wretr, wredis).
func backendRetries(t *testing.T, h *HAProxy, backend string) (retries, redispatches int) {
	t.Helper()
	out, err := h.Cmd1(t, "show stat")
	if err != nil {
		t.Fatalf("show stat: %v", err)
	}
	for line := range strings.Lines(out) {
		f := strings.Split(line, ",")
		if len(f) > 16 && f[0] == backend && f[1] == "BACKEND" {
			retries, _ = strconv.Atoi(f[15])
			redispatches, _ = strconv.Atoi(f[16])
		}
	}
	return retries, redispatches
}

// A replica killed under load. With haproxy.l7_retries, requests it had
// accepted but not answered (a 503 "server shutting down", or a connection
// reset before any byte) and requests sent to it before HAProxy's checks
// notice go to another replica: none of the requests not yet streaming
// fails. The default render retries refused connections only: every request
// sent after the kill is served, and only requests already on the replica
// when it died may fail. Streams already open on it are cut; nothing can
// save those.
func TestRetryBeforeBytes(t *testing.T) {
	for _, tc := range []struct {
		name, spoe string
		l7         bool
	}{{"HAProxyLua", "", true}, {"HAProxySPOE", spoeDefault, true}, {"HAProxySPOEConnFailureOnly", spoeDefault, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ms := streamingMocks(t, "rb", 3, mock.RoleMixed)
			ha := ""
			if tc.l7 {
				ha = ", l7_retries: true"
			}
			s := startStackHA(t, "open", tc.spoe, ha, depSpec{name: "llama", policy: policyLeast, mocks: ms})
			if tc.spoe != "" {
				s.H.WaitServersUp(t, "turnout_spoe/agent0")
			}
			c := &http.Client{Timeout: 30 * time.Second}
			body := func(stream bool) []byte {
				return bytes.Replace(chatBody("llama", "s", "retry", stream), []byte(`"max_tokens":2`), []byte(fmt.Sprintf(`"max_tokens":%d`, foTokens)), 1)
			}
			var (
				mu                      sync.Mutex
				ok, cut, onDead         int
				failed, inFlight        []string
				wg                      sync.WaitGroup
				before, after, duration = 40, 120, time.Second / foRate
			)
			one := func(i int) {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodPost, s.H.URL+"/v1/chat/completions", bytes.NewReader(body(i%2 == 0)))
				req.Header.Set("Content-Type", "application/json")
				res, err := c.Do(req)
				mu.Lock()
				defer mu.Unlock()
				// Sent before the kill: possibly on the replica when it died.
				fail := &failed
				if !tc.l7 && i <= before {
					fail = &inFlight
				}
				if err != nil {
					*fail = append(*fail, fmt.Sprintf("#%d: %v", i, err))
					return
				}
				b, rerr := io.ReadAll(res.Body)
				res.Body.Close()
				switch {
				case res.StatusCode != 200:
					*fail = append(*fail, fmt.Sprintf("#%d: %d %s (%s)", i, res.StatusCode, b, res.Header.Get("X-Replica")))
				case rerr != nil || (i%2 == 0 && !bytes.Contains(b, []byte("[DONE]"))):
					// Headers came: the stream was open when its replica died.
					cut++
					if res.Header.Get("X-Replica") == ms[0].Name {
						onDead++
					}
				default:
					ok++
				}
			}
			tick := time.NewTicker(duration)
			for i := range before + after {
				<-tick.C
				if i == before {
					go ms[0].Close() // cuts its connections; in-flight requests get 503 "server shutting down"
				}
				wg.Add(1)
				go one(i)
			}
			tick.Stop()
			wg.Wait()
			retries, redisp := backendRetries(t, s.H, "llama_mixed")
			t.Logf("%s: %d served, %d streams cut after their headers (%d on the killed replica), %d failed before any byte (%d more sent before the kill: %s); HAProxy retries %d, redispatches %d",
				tc.name, ok, cut, onDead, len(failed), len(inFlight), strings.Join(inFlight, "; "), retries, redisp)
			if len(failed) > 0 {
				t.Errorf("%d requests not yet streaming failed when a replica died: %s", len(failed), strings.Join(failed, "; "))
			}
			if cut != onDead {
				t.Errorf("%d streams cut, only %d of them on the killed replica", cut, onDead)
			}
			if retries+redisp == 0 {
				t.Errorf("no retry: the kill hit no request in flight, the test proved nothing")
			}
		})
	}
}
