//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/mock"
)

// TestSoak (issue 16 finding 10) mixes, for $TURNOUT_SOAK (a duration;
// unset = skipped, `make soak` runs 10m), streaming and short requests
// through HAProxy (Lua and SPOE) and nginx with proxy reloads, replica churn,
// replica kills and turnout reloads, then asserts that every decision
// turnout made was closed by the proxies' completion feedback
// (turnout_endpoint_inflight back to 0, decision_ttl far away). It prints
// failed/total per stack for docs/reliability.md.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("TURNOUT_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set TURNOUT_SOAK=10m (make soak) to run the soak test")
	}
	stream := func(c *mock.Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 20 * time.Millisecond
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 100 * time.Millisecond // 20 tokens: a 2 s stream
	}
	t.Run("HAProxyLua", func(t *testing.T) {
		t.Parallel()
		s := startStack(t, "open", depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "sl", 4, stream)})
		soak(t, d, haproxyTarget(t, s, stream))
	})
	t.Run("HAProxySPOE", func(t *testing.T) {
		t.Parallel()
		s := startStackWith(t, "open", FreeAddr(t), depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "ss", 4, stream)})
		soak(t, d, haproxyTarget(t, s, stream))
	})
	t.Run("NginxBody", func(t *testing.T) {
		t.Parallel()
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "body", mocks: mocks(t, "sn", 4, stream)})
		soak(t, d, soakTarget{
			url: s.N.URL, T: s.T, mocks: &s.deps[0].mocks,
			rewrite:     func() { s.T.Rewrite(t, s.yaml()+soakTTL) },
			reloadProxy: func() { _ = s.N.Cmd.Process.Signal(syscall.SIGHUP) },
			newMock:     func(name string) *Mock { return StartMock(t, name, stream) },
		})
	})
}

// soakTTL keeps turnout from expiring a lost decision during the run.
const soakTTL = "decision_ttl: 1h\n"

type soakTarget struct {
	url         string
	T           *Turnout
	mocks       *[]*Mock
	rewrite     func()
	reloadProxy func()
	newMock     func(name string) *Mock
}

func haproxyTarget(t *testing.T, s *hstack, edit func(*mock.Config)) soakTarget {
	return soakTarget{
		url: s.H.URL, T: s.T, mocks: &s.deps[0].mocks,
		rewrite:     func() { s.T.Rewrite(t, s.yaml()+soakTTL) },
		reloadProxy: func() { _ = s.H.Cmd.Process.Signal(syscall.SIGUSR2) },
		newMock:     func(name string) *Mock { return StartMock(t, name, edit) },
	}
}

func soak(t *testing.T, d time.Duration, st soakTarget) {
	st.rewrite() // decision_ttl: 1h
	time.Sleep(2 * time.Second)
	rcvErrs0 := udpRcvbufErrors()
	var total, failed, streams atomic.Int64
	var mu sync.Mutex
	var samples []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				isStream := i%2 == 0
				ok, why := soakRequest(client, st.url, isStream, fmt.Sprintf("w%d-%d", w, i))
				total.Add(1)
				if isStream {
					streams.Add(1)
				}
				if !ok {
					failed.Add(1)
					mu.Lock()
					if len(samples) < 10 {
						samples = append(samples, why)
					}
					mu.Unlock()
				}
			}
		}()
	}

	var events []string
	counter := 0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(2000+rand.IntN(2000)) * time.Millisecond)
		ms := *st.mocks
		switch ev := rand.IntN(5); ev {
		case 0:
			st.reloadProxy()
			events = append(events, "proxy reload")
		case 1: // churn: replace a replica gracefully (it leaves the config first)
			counter++
			i := rand.IntN(len(ms))
			old := ms[i]
			nm := st.newMock(fmt.Sprintf("churn-%d", counter))
			next := append(append([]*Mock(nil), ms[:i]...), ms[i+1:]...)
			*st.mocks = append(next, nm)
			st.rewrite()
			go func() { time.Sleep(5 * time.Second); _ = old.Close() }()
			events = append(events, "churn")
		case 2: // kill: a replica dies with its streams, then leaves the config
			counter++
			i := rand.IntN(len(ms))
			_ = ms[i].Close()
			nm := st.newMock(fmt.Sprintf("kill-%d", counter))
			next := append(append([]*Mock(nil), ms[:i]...), ms[i+1:]...)
			*st.mocks = append(next, nm)
			st.rewrite()
			events = append(events, "replica kill")
		case 3:
			_ = st.T.Cmd.Process.Signal(syscall.SIGHUP)
			events = append(events, "turnout reload")
		case 4:
			events = append(events, "quiet")
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("soak %v: %d/%d requests failed (%d streams); events: %d (%s)", d, failed.Load(), total.Load(), streams.Load(), len(events), countEvents(events))
	if len(samples) > 0 {
		t.Logf("failure samples: %q", samples)
	}
	Eventually(t, 30*time.Second, "every decision to close (turnout_endpoint_inflight back to 0)", func() bool {
		v, err := Metric(t, st.T.URL+"/metrics", "turnout_endpoint_inflight")
		if err == nil && v != 0 {
			return false
		}
		return err == nil
	})
	if n := udpRcvbufErrors() - rcvErrs0; n > 0 {
		t.Logf("note: the kernel dropped %d UDP datagrams (RcvbufErrors, all sockets) during the run", n)
	}
}

// soakRequest sends one request; a stream must end with [DONE].
func soakRequest(c *http.Client, url string, stream bool, user string) (bool, string) {
	body, _ := json.Marshal(map[string]any{
		"model": "llama", "messages": []map[string]string{{"role": "user", "content": user}},
		"max_tokens": 20, "stream": stream,
	})
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		return false, fmt.Sprintf("%d %.200s", res.StatusCode, b)
	}
	if !stream {
		_, err := io.Copy(io.Discard, res.Body)
		return err == nil, fmt.Sprint(err)
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "[DONE]") {
			return true, ""
		}
	}
	return false, fmt.Sprintf("stream cut: %v", sc.Err())
}

func countEvents(ev []string) string {
	m := map[string]int{}
	for _, e := range ev {
		m[e]++
	}
	var parts []string
	for _, k := range []string{"proxy reload", "churn", "replica kill", "turnout reload", "quiet"} {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// udpRcvbufErrors reads the kernel's UDP RcvbufErrors counter (datagrams
// dropped because a socket's receive buffer was full).
func udpRcvbufErrors() int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	var head []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(f) {
				var n int64
				fmt.Sscan(f[i], &n)
				return n
			}
		}
	}
	return 0
}
