//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// ngTry is one request of the nginx load tests: streamed or not. streaming says
// whether the failure (if any) came after the response started: a stream
// open on the killed replica, which nothing can save.
func ngTry(c *http.Client, url, model string, hdr map[string]string, stream bool, tokens int) (streaming bool, failure string) {
	body, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": "kill"}}, "max_tokens": tokens, "stream": stream})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b := new(bytes.Buffer)
		_, _ = b.ReadFrom(res.Body)
		return false, fmt.Sprintf("%d %s", res.StatusCode, b)
	}
	if !stream {
		var out struct{ Choices []any }
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil || len(out.Choices) == 0 {
			return true, fmt.Sprintf("body from %s: %v", res.Header.Get("X-Replica"), err)
		}
		return false, ""
	}
	n, done := 0, false
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		n += strings.Count(sc.Text(), `"delta":{"content"`)
		done = done || sc.Text() == "data: [DONE]"
	}
	if n != tokens || !done {
		return true, fmt.Sprintf("stream from %s: %d/%d tokens, [DONE] %v, err %v", res.Header.Get("X-Replica"), n, tokens, done, sc.Err())
	}
	return false, ""
}

// Issue 28 item 8: a replica killed under load (streamed and short
// requests, header and body mode). Requests it answers "503 server
// shutting down" while dying, requests cut or refused once it is gone,
// before turnout's health check notices: all go to the verdict's first
// fallback, none fails. Only streams already open on it may break.
func TestNginxReplicaKilledUnderLoad(t *testing.T) {
	timing := func(c *mock.Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 20 * time.Millisecond
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 40 * time.Millisecond
	}
	s := startNginxStack(t, "open",
		ndep{name: "bdy", policy: policyLeast, mode: "body", mocks: mocks(t, "kb", 3, timing)},
		ndep{name: "hdr", policy: policyLeast, mode: "header", mocks: mocks(t, "kh", 3, timing)},
	)
	stop := make(chan struct{})
	var okN, broken, failN atomic.Int64
	var mu sync.Mutex
	var errs, brokenMsgs []string
	c := &http.Client{Timeout: 30 * time.Second}
	wg := ngClients(stop, 8, func(_, i int, model string, h map[string]string) {
		// Streams of 10 tokens (0.4 s) and short answers of 3 (0.14 s, in
		// flight on the replica until then).
		streaming, msg := ngTry(c, s.N.URL, model, h, i%2 == 0, 3+7*((i+1)%2))
		mu.Lock()
		defer mu.Unlock()
		switch {
		case msg == "":
			okN.Add(1)
		case streaming:
			broken.Add(1)
			brokenMsgs = append(brokenMsgs, model+": "+msg)
		default:
			failN.Add(1)
			if len(errs) < 20 {
				errs = append(errs, model+": "+msg)
			}
		}
	})
	time.Sleep(time.Second)
	// The replica dies as vLLM does: it first answers what it accepts with
	// 503 "server shutting down" (its /health still answers), then its
	// connections are cut and its port refuses.
	killed := []*Mock{s.dep("bdy").mocks[0], s.dep("hdr").mocks[0]}
	before := make([]int64, len(killed))
	for i, m := range killed {
		before[i] = m.Stats().Requests
		if err := m.SetFaults(mock.Faults{ShuttingDown: true}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	dying := make([]int64, len(killed))
	for i, m := range killed {
		dying[i] = m.Stats().Requests - before[i]
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()

	for i, m := range killed {
		if before[i] == 0 || dying[i] == 0 {
			t.Errorf("%s had %d requests before it was dying, %d while dying: the test did not test", m.Name, before[i], dying[i])
		}
	}
	if failN.Load() != 0 || okN.Load() == 0 {
		t.Errorf("%d served, %d failed before any response byte (want 0): %v", okN.Load(), failN.Load(), errs)
	}
	t.Logf("replica killed under load: %d served, %d failed before any byte, %d broke after the response started (open on the killed replica: %v); the dying replicas answered %v requests with 503",
		okN.Load(), failN.Load(), broken.Load(), brokenMsgs, dying)
}
