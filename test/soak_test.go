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

	"github.com/turnout/turnout/lab/mock"
)

// TestSoak (issue 16 finding 10, issue 28) mixes, for $TURNOUT_SOAK (a
// duration; unset = skipped, `make soak` runs 10m), streaming and short
// requests through HAProxy (Lua and SPOE) and nginx with proxy reloads,
// membership churn, replica restarts (killed with their streams, replaced),
// turnout reloads and turnout restarts (SIGTERM and SIGKILL in turn), then
// asserts that the only failed requests are streams already open on a
// killed replica, and that every decision the last turnout made was closed
// by the proxies' completion feedback (turnout_endpoint_inflight back to 0,
// decision_ttl far away). It prints failed/total per cause and turnout's
// RSS, goroutines and open fds at the start and the end for
// docs/reliability.md.
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
			rewrite:     func() { s.T.Rewrite(t, soakYAML(t, s.yaml())) },
			reloadProxy: func() { _ = s.N.Cmd.Process.Signal(syscall.SIGHUP) },
			newMock:     func(name string) *Mock { return StartMock(t, name, stream) },
			restartMock: func(old *Mock) *Mock { return StartMockAt(t, old.Name, old.Addr, stream) },
		})
	})
}

// soakYAML is a stack's config for the soak: decision_ttl far away, so a
// lost decision stays visible, and health checks that time out after 1 s
// instead of the stacks' 300 ms: three stacks, 12 replicas and the
// restarts on a shared 2-core box once starved every check of one backend
// at once (82 HAProxy 503s "no server available"), which is not what the
// soak is after.
func soakYAML(t *testing.T, y string) string {
	const fast, slow = "health: {interval: 300ms, timeout: 300ms", "health: {interval: 300ms, timeout: 1s"
	if !strings.Contains(y, fast) {
		t.Fatalf("soak: the stack's config has no %q to relax", fast)
	}
	return strings.Replace(y, fast, slow, 1) + "decision_ttl: 1h\n"
}

type soakTarget struct {
	url         string
	T           *Turnout
	mocks       *[]*Mock
	rewrite     func()
	reloadProxy func()
	newMock     func(name string) *Mock
	// restartMock starts a replica again on old's name and address.
	restartMock func(old *Mock) *Mock
}

// restartTurnout stops turnout (SIGKILL when kill, else SIGTERM: it closes
// its listeners and finishes what it started) and starts it again with the
// same command line, as a crash or a rolling update would; the proxies fail
// open meanwhile. st.T keeps pointing at the running turnout.
func (st soakTarget) restartTurnout(t *testing.T, kill bool) {
	old := st.T.Proc
	if kill {
		_ = old.Cmd.Process.Kill()
	}
	old.Stop()
	st.T.Proc = StartProc(t, "turnout", old.Cmd.Path, old.Cmd.Args[1:]...)
	WaitHTTP(t, st.T.URL+"/healthz", 10*time.Second)
}

// procFigures are turnout's RSS, goroutines and open fds (its /metrics).
type procFigures struct {
	rssMB, goroutines, fds float64
	at                     time.Time
}

func readProcFigures(t *testing.T, url string) procFigures {
	f := procFigures{at: time.Now()}
	for _, m := range []struct {
		name string
		v    *float64
	}{{"process_resident_memory_bytes", &f.rssMB}, {"go_goroutines", &f.goroutines}, {"process_open_fds", &f.fds}} {
		v, err := Metric(t, url+"/metrics", m.name)
		if err != nil {
			t.Logf("%s: %v", m.name, err)
		}
		*m.v = v
	}
	f.rssMB /= 1e6
	return f
}

func (f procFigures) String() string {
	return fmt.Sprintf("%.1f MB RSS, %.0f goroutines, %.0f fds", f.rssMB, f.goroutines, f.fds)
}

// lifetime is one turnout process's figures after warm-up and before it
// was stopped (or at the end of the soak).
type lifetime struct{ first, last procFigures }

func (l lifetime) String() string {
	return fmt.Sprintf("%v -> %v over %v", l.first, l.last, l.last.at.Sub(l.first.at).Round(time.Second))
}

func haproxyTarget(t *testing.T, s *hstack, edit func(*mock.Config)) soakTarget {
	return soakTarget{
		url: s.H.URL, T: s.T, mocks: &s.deps[0].mocks,
		rewrite:     func() { s.T.Rewrite(t, soakYAML(t, s.yaml())) },
		reloadProxy: func() { _ = s.H.Cmd.Process.Signal(syscall.SIGUSR2) },
		newMock:     func(name string) *Mock { return StartMock(t, name, edit) },
		restartMock: func(old *Mock) *Mock { return StartMockAt(t, old.Name, old.Addr, edit) },
	}
}

func getMetrics(t *testing.T, url string) string {
	res, err := http.Get(url + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// soakKilledCut is the one failure the soak allows: a stream already open
// on a replica that was killed (its bytes are gone with it).
const soakKilledCut = "stream open on a killed replica, cut"

func soak(t *testing.T, d time.Duration, st soakTarget) {
	st.rewrite() // decision_ttl: 1h
	time.Sleep(2 * time.Second)
	rcvErrs0 := udpRcvbufErrors()
	// Figures of the first turnout at the start, and of the longest-lived
	// one from its start to its stop: restarts make a start-vs-end
	// comparison of one process span part of the run only.
	first := lifetime{first: readProcFigures(t, st.T.URL)}
	cur, longest := first, lifetime{}
	lastRestart := time.Now()
	var total, failed, streams atomic.Int64
	var mu sync.Mutex
	causes := map[string]int{}
	samples := map[string]string{}
	killed := map[string]bool{} // replicas killed with their streams
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
				r := soakRequest(client, st.url, isStream, fmt.Sprintf("w%d-%d", w, i))
				total.Add(1)
				if isStream {
					streams.Add(1)
				}
				if r.ok {
					continue
				}
				failed.Add(1)
				mu.Lock()
				cause := r.cause
				if cause == "stream cut" && killed[r.replica] {
					cause = soakKilledCut
				}
				causes[cause]++
				if _, ok := samples[cause]; !ok {
					samples[cause] = r.replica + ": " + r.detail
				}
				mu.Unlock()
			}
		}()
	}

	var events []string
	counter := 0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(2000+rand.IntN(2000)) * time.Millisecond)
		ms := *st.mocks
		switch ev := rand.IntN(6); ev {
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
		case 2: // replica restart: it dies with its streams, and comes back
			counter++
			i := rand.IntN(len(ms))
			mu.Lock()
			killed[ms[i].Name] = true
			mu.Unlock()
			_ = ms[i].Close()
			if counter%2 == 0 {
				// In place, a second later (a container restarted in its
				// pod): the config does not change, health checks see it.
				time.Sleep(time.Second)
				(*st.mocks)[i] = st.restartMock(ms[i])
				events = append(events, "replica restart (same address)")
				break
			}
			// Replaced (a pod restarted elsewhere): it leaves the config.
			nm := st.newMock(fmt.Sprintf("kill-%d", counter))
			next := append(append([]*Mock(nil), ms[:i]...), ms[i+1:]...)
			*st.mocks = append(next, nm)
			st.rewrite()
			events = append(events, "replica restart (replaced)")
		case 3:
			_ = st.T.Cmd.Process.Signal(syscall.SIGHUP)
			events = append(events, "turnout reload")
		case 4:
			// At most one a minute, so each turnout lives long enough
			// for its own figures to mean something.
			if time.Since(lastRestart) < time.Minute {
				events = append(events, "quiet")
				break
			}
			counter++
			cur.last = readProcFigures(t, st.T.URL)
			if cur.last.at.Sub(cur.first.at) > longest.last.at.Sub(longest.first.at) {
				longest = cur
			}
			if first.last.at.IsZero() {
				first.last = cur.last
			}
			st.restartTurnout(t, counter%2 == 0)
			lastRestart = time.Now()
			time.Sleep(time.Second)
			cur = lifetime{first: readProcFigures(t, st.T.URL)}
			events = append(events, "turnout restart")
		case 5:
			events = append(events, "quiet")
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("soak %v: %d/%d requests failed (%d streams); events: %d (%s)", d, failed.Load(), total.Load(), streams.Load(), len(events), countEvents(events))
	for cause, n := range causes {
		t.Logf("failed: %d %s (e.g. %s)", n, cause, samples[cause])
		if cause != soakKilledCut {
			t.Errorf("%d requests failed for another reason than a killed replica: %s (e.g. %s)", n, cause, samples[cause])
		}
	}
	closed := func() bool {
		v, err := Metric(t, st.T.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	}
	for deadline := time.Now().Add(30 * time.Second); !closed(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(getMetrics(t, st.T.URL), "\n") {
				if (strings.HasPrefix(l, "turnout_endpoint_inflight") && !strings.HasSuffix(l, " 0")) ||
					strings.HasPrefix(l, "turnout_completions_total") || strings.HasPrefix(l, "turnout_feedback_") {
					lines = append(lines, l)
				}
			}
			t.Errorf("decisions still open 30s after the load stopped (turnout restarted %v ago; kernel UDP receive drops during the run: %d):\n%s",
				time.Since(lastRestart).Round(time.Second), udpRcvbufErrors()-rcvErrs0, strings.Join(lines, "\n"))
			break
		}
	}
	cur.last = readProcFigures(t, st.T.URL)
	if cur.last.at.Sub(cur.first.at) > longest.last.at.Sub(longest.first.at) {
		longest = cur
	}
	t.Logf("turnout figures: first turnout at the start %v; last turnout at the end %v; longest-lived turnout %v", first.first, cur.last, longest)
	if n := udpRcvbufErrors() - rcvErrs0; n > 0 {
		t.Logf("note: the kernel dropped %d UDP datagrams (RcvbufErrors, all sockets) during the run", n)
	}
}

// soakResult is one request's outcome: the replica that answered (from
// its X-Replica header), and why it failed.
type soakResult struct {
	ok            bool
	replica       string
	cause, detail string
}

// soakRequest sends one request; a stream must end with [DONE].
func soakRequest(c *http.Client, url string, stream bool, user string) soakResult {
	body, _ := json.Marshal(map[string]any{
		"model": "llama", "messages": []map[string]string{{"role": "user", "content": user}},
		"max_tokens": 20, "stream": stream,
	})
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	// As the openai SDKs do: a POST written into a keep-alive connection
	// the proxy closed at that moment (an nginx reload closes idle ones)
	// was never read; the key lets Go's transport send it again, as the
	// SDKs' own retries would (kube_test.go does the same).
	req.Header.Set("Idempotency-Key", user)
	res, err := c.Do(req)
	if err != nil {
		return soakResult{cause: "no response (transport error)", detail: err.Error()}
	}
	defer res.Body.Close()
	r := soakResult{replica: res.Header.Get(mock.HeaderReplica)}
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		r.cause, r.detail = fmt.Sprintf("status %d before any byte", res.StatusCode), fmt.Sprintf("%.200s", b)
		if bytes.Contains(b, []byte("shutting down")) {
			r.cause += " (a dying replica refused it)"
		}
		return r
	}
	if !stream {
		_, err := io.Copy(io.Discard, res.Body)
		r.ok, r.cause, r.detail = err == nil, "short answer cut", fmt.Sprint(err)
		return r
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "[DONE]") {
			r.ok = true
			return r
		}
	}
	r.cause, r.detail = "stream cut", fmt.Sprint(sc.Err())
	return r
}

func countEvents(ev []string) string {
	m := map[string]int{}
	for _, e := range ev {
		m[e]++
	}
	var parts []string
	for _, k := range []string{"proxy reload", "churn", "replica restart (replaced)", "replica restart (same address)", "turnout reload", "turnout restart", "quiet"} {
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
