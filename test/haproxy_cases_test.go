//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// 3. SSE chunks 100 ms apart reach the client as they are sent.
func testStreaming(t *testing.T, s *hstack) {
	body, _ := json.Marshal(map[string]any{
		"model": "stream", "messages": []map[string]string{{"role": "user", "content": "count"}},
		"max_tokens": 6, "stream": true,
	})
	req, _ := http.NewRequest(http.MethodPost, s.H.URL+"/v1/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	var arrivals []time.Time
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data: ") && !strings.Contains(line, "[DONE]") && strings.Contains(line, `"delta":{"content"`) {
			// One event per token; the role event goes out with the first token.
			arrivals = append(arrivals, time.Now())
		}
	}
	if len(arrivals) < 5 {
		t.Fatalf("got %d content chunks, want >= 5", len(arrivals))
	}
	// Tokens are generated 100 ms apart; each must arrive within 50 ms of
	// its schedule, measured from the first token's arrival.
	for i := 1; i < len(arrivals); i++ {
		gap := arrivals[i].Sub(arrivals[i-1])
		if gap < 50*time.Millisecond || gap > 150*time.Millisecond {
			t.Errorf("chunk %d arrived %v after the previous one, want 100ms +- 50ms (buffering?)", i, gap)
		}
	}
}

// 6. Unknown model: turnout's 404 JSON reaches the client; garbage is served.
func testRefusals(t *testing.T, s *hstack) {
	r := s.post(t, "/v1/chat/completions", chatBody("no-such-model", "s", "u", false), nil)
	if r.Status != 404 || !json.Valid(r.Body) || !strings.Contains(string(r.Body), "model_not_found") {
		t.Errorf("unknown model: %d %s", r.Status, r.Body)
	}
	if r.Header.Get("X-Replica") != "" {
		t.Errorf("unknown model reached replica %s", r.Header.Get("X-Replica"))
	}
	r = s.post(t, "/v1/chat/completions", []byte(`{"model":"chat","messages":[{"role":"user","content":"x"}`+"\x00garbage"), nil)
	if r.Header.Get("X-Replica") == "" {
		t.Errorf("garbage body was not served by a replica: %d %s", r.Status, r.Body)
	}
}

// 7. A client-sent X-Turnout-Server neither picks the server nor reaches it.
func testSpoof(t *testing.T, s *hstack) {
	hdr := map[string]string{"X-Session-ID": "spoof-test"}
	home := s.post(t, "/v1/chat/completions", chatBody("chat", "s", "u", false), hdr).Header.Get("X-Replica")
	var other string
	for _, m := range s.deps[0].mocks {
		if m.Name != home {
			other = m.Name
		}
	}
	for i := range 20 {
		h := map[string]string{"X-Session-ID": "spoof-test", "X-Turnout-Server": other, "X-Turnout-Pool": "llama_mixed"}
		r := s.post(t, "/v1/chat/completions", chatBody("chat", "s", "u", false), h)
		if got := r.Header.Get("X-Replica"); got != home {
			t.Fatalf("request %d with X-Turnout-Server %s landed on %s, want %s", i, other, got, home)
		}
	}
	res, err := http.Get("http://" + mockByName(s, home).Addr + "/mock/requests")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var buf strings.Builder
	_, _ = bufio.NewReader(res.Body).WriteTo(&buf)
	if strings.Contains(strings.ToLower(buf.String()), "x-turnout-server") {
		t.Error("the replica received the client's X-Turnout-Server header")
	}
}

func mockByName(s *hstack, name string) *Mock {
	for _, d := range s.deps {
		for _, m := range d.mocks {
			if m.Name == name {
				return m
			}
		}
	}
	return nil
}

// 9. After a burst, turnout's in-flight counts come back to 0 through the
// syslog completion feedback.
func testInflight(t *testing.T, s *hstack) {
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model := []string{"chat", "llama"}[i%2]
			r, err := Post(context.Background(), s.client, s.H.URL+"/v1/chat/completions",
				chatBody(model, "burst", fmt.Sprintf("q%d", i), i%3 == 0), map[string]string{"X-Session-ID": fmt.Sprint(i)})
			if err != nil || r.Status != 200 {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d burst requests failed", failed.Load())
	}
	Eventually(t, 10*time.Second, "turnout_endpoint_inflight to return to 0", func() bool {
		v, err := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	})
}

// 4. Add one replica and remove another through the config under load: no
// failed request, no reload, traffic moves.
func TestHAProxyMembershipUnderLoad(t *testing.T) { testMembershipUnderLoad(t, "") }

// TestHAProxyMembershipUnderLoadSPOE: the same with HAProxy asking turnout
// over SPOE (its agent backend must not look like a removed pool).
func TestHAProxyMembershipUnderLoadSPOE(t *testing.T) { testMembershipUnderLoad(t, FreeAddr(t)) }

func testMembershipUnderLoad(t *testing.T, spoeAddr string) {
	ms := mocks(t, "m", 4, nil)
	s := startStackWith(t, "open", spoeAddr, depSpec{name: "llama", policy: policyLeast, mocks: ms[:3]})
	pid := s.H.Info(t)["Pid"]

	stop := make(chan struct{})
	var okN, failN atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := Post(context.Background(), s.client, s.H.URL+"/v1/chat/completions",
					chatBody("llama", "load", fmt.Sprintf("w%d-%d", w, i), i%4 == 0), nil)
				if err != nil || r.Status != 200 {
					failN.Add(1)
					continue
				}
				okN.Add(1)
			}
		}()
	}
	deadline := time.AfterFunc(20*time.Second, func() { close(stop) }) // hard bound on the load
	defer deadline.Stop()

	time.Sleep(300 * time.Millisecond) // load before the change
	s.deps[0].mocks = []*Mock{ms[0], ms[2], ms[3]}
	s.T.Rewrite(t, s.yaml())
	var removedAt int64
	Eventually(t, 15*time.Second, "m-3 added and m-1 deleted in HAProxy", func() bool {
		st := s.H.ServerStatus(t)
		_, has1 := st["llama_mixed/m-1"]
		if st["llama_mixed/m-3"] == "UP" && !has1 {
			removedAt = ms[1].Stats().Requests
			return true
		}
		return false
	})
	time.Sleep(500 * time.Millisecond) // load after the change
	if deadline.Stop() {
		close(stop)
	}
	wg.Wait()

	if failN.Load() != 0 || okN.Load() == 0 {
		t.Errorf("load: %d ok, %d failed; want no failures", okN.Load(), failN.Load())
	}
	if got := s.H.Info(t)["Pid"]; got != pid {
		t.Errorf("HAProxy worker pid %s -> %s: membership change caused a reload", pid, got)
	}
	if ms[3].Stats().Requests == 0 {
		t.Error("added replica m-3 got no traffic")
	}
	if n := ms[1].Stats().Requests; n != removedAt {
		t.Errorf("removed replica m-1 got %d requests after its deletion", n-removedAt)
	}
}

// 5. turnout stopped: fail-open keeps serving with little added latency once
// the breaker is open; fail-closed answers 503 with a reason.
func TestHAProxyTurnoutDown(t *testing.T) {
	t.Run("FailOpen", func(t *testing.T) {
		s := startStack(t, "open", depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "o", 3, nil)})
		body := chatBody("llama", "s", "u", false)
		var base []time.Duration
		for range 20 {
			r := s.post(t, "/v1/chat/completions", body, nil)
			if r.Status != 200 {
				t.Fatalf("turnout up: status %d", r.Status)
			}
			base = append(base, r.Dur)
		}
		s.T.Stop()
		var down []time.Duration
		for i := range 40 {
			r := s.post(t, "/v1/chat/completions", body, nil)
			if r.Status != 200 || r.Header.Get("X-Replica") == "" {
				t.Fatalf("turnout down, request %d: status %d %s", i, r.Status, r.Body)
			}
			down = append(down, r.Dur)
		}
		// Per HAProxy thread the breaker opens after 3 failures; skip those.
		after := down[10:]
		if d := median(after) - median(base); d > 100*time.Millisecond {
			t.Errorf("added latency with turnout down: %v (median %v vs %v)", d, median(after), median(base))
		}
		t.Logf("median latency: turnout up %v, down (breaker open) %v; worst while tripping %v", median(base), median(after), maxDur(down[:10]))
	})
	t.Run("FailClosed", func(t *testing.T) {
		s := startStack(t, "closed", depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "c", 3, nil)})
		if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", "u", false), nil); r.Status != 200 {
			t.Fatalf("turnout up: status %d", r.Status)
		}
		s.T.Stop()
		for i := range 10 {
			r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", "u", false), nil)
			if r.Status != 503 || r.Header.Get("X-Turnout-Reason") == "" || r.Header.Get("X-Replica") != "" {
				t.Fatalf("request %d: status %d reason %q replica %q", i, r.Status, r.Header.Get("X-Turnout-Reason"), r.Header.Get("X-Replica"))
			}
		}
	})
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func maxDur(d []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range d {
		m = max(m, x)
	}
	return m
}
