//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// abusePost sends one streamed chat request with hdr and times its first byte.
func abusePost(c *http.Client, url, model, content string, hdr map[string]string) (int, time.Duration, error) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 16, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if _, err := br.ReadByte(); err != nil {
		return res.StatusCode, 0, fmt.Errorf("first byte: %w", err)
	}
	ttft := time.Since(start)
	_, err = br.WriteTo(io.Discard)
	return res.StatusCode, ttft, err
}

// paced calls fn(i) for i in [0, n), the i-th at from + i*every (an open
// loop: a slow call does not delay the next).
func paced(from time.Time, n int, every time.Duration, fn func(i int)) {
	for i := range n {
		time.Sleep(time.Until(from.Add(time.Duration(i) * every)))
		fn(i)
	}
}

// An attacker that sends x-priority: critical and a new tenant (header
// and API key) per request, at 1.5x the replicas' capacity with 40 KB
// bodies, buys neither a class nor turns of its own: the priority and
// tenant headers are untrusted (the default), so its requests are
// standard and share one tenant, and a tenant named by a listed API key
// takes turns with that one shared tenant instead of waiting behind it:
// its TTFT p50 stays within 2x of its unloaded p50. turnout's RSS stays
// under max_buffered_bytes + 32 MiB.
func TestFlowControlUntrustedAttacker(t *testing.T) {
	for _, path := range []string{"spoe", "lua", "nginx"} {
		t.Run(path, func(t *testing.T) { testUntrustedAttacker(t, path) })
	}
}

// testUntrustedAttacker runs the attack through HAProxy (path "spoe" or
// "lua") or nginx (body mode, njs).
func testUntrustedAttacker(t *testing.T, path string) {
	// 2 replicas x 2 running, ~410 ms a request: ~9.8 requests/s (a load
	// a busy 2-core box carries beside the proxy and turnout).
	ms := mocks(t, "fa", 2, func(c *mock.Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 250 * time.Millisecond
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 10 * time.Millisecond
		c.MaxRunning = 2
	})
	const capacity = 2 * 2 / 0.41
	goodKey := sha256.Sum256([]byte("Bearer good-key"))
	budget := 64 << 20 // limits.max_buffered_bytes's default
	flowYAML := []string{
		"flow_control:",
		"  tenant_api_key: true",
		"  tenant_keys: {" + hex.EncodeToString(goodKey[:]) + ": good}",
		"  saturation: {max_load: 2}",
	}
	var front, tu string
	switch path {
	case "nginx":
		s := (&nstack{failMode: "open", deps: []ndep{{name: "fa", policy: policyLeast, mode: "body", mocks: ms, depYAML: flowYAML}}}).start(t)
		front, tu = s.N.URL, s.T.URL
	default:
		spoe := spoeDefault
		if path == "lua" {
			spoe = ""
		}
		s := startStackWith(t, "open", spoe, depSpec{name: "fa", policy: policyLeast, mocks: ms, depYAML: flowYAML})
		front, tu = s.H.URL, s.T.URL
	}
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	good := map[string]string{"Authorization": "Bearer good-key"}

	var alone []time.Duration
	for i := range 10 {
		st, ttft, err := abusePost(c, front, "fa", fmt.Sprint("good alone ", i), good)
		if err != nil || st != 200 {
			t.Fatalf("unloaded request: %d %v", st, err)
		}
		alone = append(alone, ttft)
	}
	aloneP50 := quantile(alone, 0.5)

	var maxRSS atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			if v, err := Metric(t, tu+"/metrics", "process_resident_memory_bytes"); err == nil && int64(v) > maxRSS.Load() {
				maxRSS.Store(int64(v))
			}

			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()

	const attack = 8 * time.Second
	rate := 1.5 * capacity
	filler := strings.Repeat("x", 40<<10)
	var wg sync.WaitGroup
	var attackerErrs atomic.Int64
	start := time.Now()
	// The good tenant, 2 requests/s from 2 s into the attack (once the
	// shared tenant's queue built), paced on its own goroutine so its
	// requests arrive among the attacker's, not as one burst after them.
	var loaded []time.Duration
	var late []int
	var mu sync.Mutex
	var gw sync.WaitGroup
	gw.Add(1)
	go func() {
		defer gw.Done()
		paced(start.Add(2*time.Second), 12, 500*time.Millisecond, func(i int) {
			gw.Add(1)
			go func() {
				defer gw.Done()
				if time.Since(start) > attack {
					mu.Lock()
					late = append(late, i)
					mu.Unlock()
				}
				st, ttft, err := abusePost(c, front, "fa", fmt.Sprint("good loaded ", i), good)
				if err != nil || st != 200 {
					t.Errorf("good request under attack: %d %v", st, err)
					return
				}
				mu.Lock()
				loaded = append(loaded, ttft)
				mu.Unlock()
			}()
		})
	}()
	paced(start, int(rate*attack.Seconds()), time.Duration(float64(time.Second)/rate), func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := map[string]string{"X-Priority": "critical", "X-Tenant-Id": fmt.Sprint("evil-", i), "Authorization": fmt.Sprint("Bearer evil-", i)}
			if st, _, err := abusePost(c, front, "fa", filler, h); err != nil || st != 200 {
				attackerErrs.Add(1)
			}
		}()
	})
	gw.Wait()
	wg.Wait()
	close(stop)
	sampler.Wait()

	loadedP50 := quantile(loaded, 0.5)
	t.Logf("good tenant TTFT p50: alone %v, under attack %v (%d served); attacker failures %d; turnout RSS max %.1f MiB",
		aloneP50, loadedP50, len(loaded), attackerErrs.Load(), float64(maxRSS.Load())/(1<<20))
	if len(late) > 0 {
		t.Errorf("good requests %v were sent after the attack's %v: the measure is not under attack", late, attack)
	}
	// Fair turns: the good tenant's request waits about one release of the
	// shared tenant's (a completion, ~100 ms with 4 slots of ~410 ms), then
	// its own time to first token.
	if loadedP50 > 2*aloneP50 {
		t.Errorf("good tenant p50 %v under attack: over 2x its unloaded %v", loadedP50, aloneP50)
	}
	// It was measured while the pool was saturated: its requests were held.
	if held, _ := Metric(t, tu+"/metrics", "turnout_flow_requests_total", `tenant="good"`, `outcome="released"`); held < float64(len(loaded))/2 {
		t.Errorf("only %v of the good tenant's %d requests under attack were held (the attack did not saturate the pool)", held, len(loaded))
	}
	if rss := maxRSS.Load(); rss == 0 || rss > int64(budget)+32<<20 {
		t.Errorf("turnout RSS %d bytes: want under max_buffered_bytes + 32 MiB", rss)
	}
	// The attacker's priority bought nothing, and its tenants share one.
	if n, _ := Metric(t, tu+"/metrics", "turnout_flow_requests_total", `class="critical"`); n != 0 {
		t.Errorf("%v requests classed critical from an untrusted header", n)
	}
	if held, _ := Metric(t, tu+"/metrics", "turnout_flow_requests_total", `tenant="none"`, `outcome="released"`); held == 0 {
		t.Error("the attacker's requests were never held (the load did not saturate the pool)")
	}
	if n, _ := Metric(t, tu+"/metrics", "turnout_flow_requests_total", `tenant="evil-`); n != 0 {
		t.Errorf("%v requests counted under a client-invented tenant", n)
	}
}
