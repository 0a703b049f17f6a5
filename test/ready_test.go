//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/mock"
)

func getReadyz(t *testing.T, url string) (int, string) {
	t.Helper()
	r, err := http.Get(url + "/readyz?verbose")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// TestReadyzServe: `turnout serve` in front of four replicas that are all
// down is not ready from its first answer on; with min_ready 2 it stays
// not ready while one replica is up and becomes ready with the second.
func TestReadyzServe(t *testing.T) {
	addrs := []string{FreeAddr(t), FreeAddr(t), FreeAddr(t), FreeAddr(t)}
	listen := FreeAddr(t)
	var eps strings.Builder
	for i, a := range addrs {
		fmt.Fprintf(&eps, "          - {name: r%d, address: %q}\n", i, a)
	}
	tu := StartTurnout(t, listen, fmt.Sprintf(`listen: %s
feedback: {disable: true}
health: {interval: 100ms, timeout: 300ms, min_ready: 2}
deployments:
  - name: llama
    policy: {name: round-robin}
    pools:
      - role: mixed
        endpoints:
%s`, listen, eps.String()))
	// From the very first answer (healthz just passed) until well after
	// several rounds: 503.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if code, body := getReadyz(t, tu.URL); code != 503 {
			t.Fatalf("ready with every replica down: %d %q", code, body)
		}
	}
	if _, body := getReadyz(t, tu.URL); !strings.Contains(body, "pool llama_mixed: 0/4 available") {
		t.Fatalf("verbose: %q", body)
	}
	start := func(addr string) {
		cfg := mock.DefaultConfig()
		cfg.Name = addr
		l := zerolog.Nop()
		s, err := mock.New(cfg, &l)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Start(addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
	}
	start(addrs[1])
	Eventually(t, 10*time.Second, "one replica seen up", func() bool {
		_, body := getReadyz(t, tu.URL)
		return strings.Contains(body, "1/4 available")
	})
	if code, body := getReadyz(t, tu.URL); code != 503 {
		t.Fatalf("1 of 4 up with min_ready 2: %d %q", code, body)
	}
	start(addrs[3])
	Eventually(t, 10*time.Second, "ready with two replicas up", func() bool {
		code, _ := getReadyz(t, tu.URL)
		return code == 200
	})
}

// getText GETs url and returns the status and body (0 on a transport error).
func getText(url string) (int, string) {
	r, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// metricLine is the /metrics line of tu that starts with prefix ("" when none).
func metricLine(tu *Turnout, prefix string) string {
	_, body := getText(tu.URL + "/metrics")
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestReadyPerModelHAProxy (issue 38 item 3): two deployments, two models,
// through HAProxy (SPOE, fail_mode closed). Every replica of beta dies
// while alpha is under load: alpha's requests keep getting 200, /readyz
// stays 200 throughout (it is what a Kubernetes Service's readiness
// follows), and /readyz?verbose and turnout_model_ready say beta is down.
func TestReadyPerModelHAProxy(t *testing.T) {
	model := func(name string) func(*mock.Config) {
		return func(c *mock.Config) { c.Models, c.StrictModels = []string{name}, true }
	}
	alpha, beta := mocks(t, "alpha", 2, model("alpha")), mocks(t, "beta", 2, model("beta"))
	s := startStackWith(t, "closed", spoeDefault,
		depSpec{name: "alpha", policy: policyLeast, mocks: alpha},
		depSpec{name: "beta", policy: policyLeast, mocks: beta})
	Eventually(t, 20*time.Second, "turnout ready", func() bool { code, _ := getText(s.T.URL + "/readyz"); return code == 200 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ok, failed, unready atomic.Int64
	var mu sync.Mutex
	var firstFail, firstUnready string
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				r, err := Post(ctx, s.client, s.H.URL+"/v1/chat/completions", chatBody("alpha", "sys", fmt.Sprintf("w%d q%d", w, i), false), nil)
				if ctx.Err() != nil {
					return
				}
				if err != nil || r.Status != 200 {
					failed.Add(1)
					mu.Lock()
					if firstFail == "" {
						firstFail = fmt.Sprintf("%v %+v", err, r)
					}
					mu.Unlock()
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if code, body := getText(s.T.URL + "/readyz"); code != 200 && ctx.Err() == nil {
				unready.Add(1)
				mu.Lock()
				if firstUnready == "" {
					firstUnready = fmt.Sprintf("%d %q", code, body)
				}
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	Eventually(t, 20*time.Second, "alpha traffic flowing", func() bool { return ok.Load() >= 50 })
	for _, m := range beta {
		_ = m.Close()
	}
	Eventually(t, 20*time.Second, "beta's replicas seen down", func() bool {
		_, body := getText(s.T.URL + "/readyz?verbose")
		return strings.Contains(body, "pool beta_mixed: 0/2 available")
	})
	at := ok.Load()
	Eventually(t, 20*time.Second, "alpha traffic after beta died", func() bool { return ok.Load() >= at+100 })
	cancel()
	wg.Wait()
	t.Logf("alpha: %d ok, %d failed; /readyz not 200 %d times", ok.Load(), failed.Load(), unready.Load())
	if failed.Load() != 0 {
		t.Errorf("%d alpha requests failed, first: %s", failed.Load(), firstFail)
	}
	if unready.Load() != 0 {
		t.Errorf("/readyz not 200 %d times with alpha serving, first: %s", unready.Load(), firstUnready)
	}
	_, body := getText(s.T.URL + "/readyz?verbose")
	for _, want := range []string{"ready\n", "model alpha: served by 2/2 of pool alpha_mixed", "pool beta_mixed: 0/2 available, min_ready 1, short",
		"model beta: served by 2/2 of pool beta_mixed [beta-0 beta-1], 0 available, not ready: pool beta_mixed has 0 available endpoints serving it, needs 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz?verbose lacks %q:\n%s", want, body)
		}
	}
	for _, want := range []string{`turnout_model_ready{deployment="alpha",model="alpha"} 1`, `turnout_model_ready{deployment="beta",model="beta"} 0`, `turnout_pool_ready{deployment="alpha",pool="alpha_mixed"} 1`, `turnout_pool_ready{deployment="beta",pool="beta_mixed"} 0`} {
		if got := metricLine(s.T, want[:len(want)-2]); got != want {
			t.Errorf("metric %q, want %q", got, want)
		}
	}
	// beta's clients get a clear refusal, not a hang.
	if r := s.post(t, "/v1/chat/completions", chatBody("beta", "sys", "q", false), nil); r.Status != 503 {
		t.Errorf("beta with every replica down: %d %s, want 503", r.Status, r.Body)
	}
}

// TestReadyzMinReadyZeroReload (issue 38 item 3): min_ready 0 under
// health: or on the pool means the pool may be empty, and holds after a
// reload: /readyz 200 with its only replica down, the verbose view says
// min_ready 0.
func TestReadyzMinReadyZeroReload(t *testing.T) {
	listen := FreeAddr(t)
	cfg := func(health, pool string) string {
		return fmt.Sprintf(`listen: %s
feedback: {disable: true}
health: {interval: 100ms, timeout: 300ms%s}
deployments:
  - name: llama
    policy: {name: round-robin}
    pools:
      - role: mixed%s
        endpoints: [{name: r0, address: %q}]
`, listen, health, pool, FreeAddr(t))
	}
	tu := StartTurnout(t, listen, cfg("", ""), "--watch", "100ms")
	Eventually(t, 10*time.Second, "not ready, min_ready 1", func() bool {
		code, body := getReadyz(t, tu.URL)
		return code == 503 && strings.Contains(body, "pool llama_mixed: 0/1 available, min_ready 1, short")
	})
	for _, c := range []struct{ name, health, pool string }{
		{"health", ", min_ready: 0", ""},
		{"pool", ", min_ready: 2", "\n        min_ready: 0"},
	} {
		tu.Rewrite(t, cfg(c.health, c.pool))
		Eventually(t, 10*time.Second, c.name+" min_ready 0 honoured after the reload", func() bool {
			code, body := getReadyz(t, tu.URL)
			return code == 200 && strings.Contains(body, "pool llama_mixed: 0/1 available, min_ready 0, ok")
		})
		if got := metricLine(tu, `turnout_pool_ready{deployment="llama",pool="llama_mixed"}`); !strings.HasSuffix(got, " 1") {
			t.Errorf("%s: %q", c.name, got)
		}
	}
}

// TestReadyBeforeReplicasLoRA (issue 42 item 6): turnout and HAProxy
// (SPOE) start before their replicas (mocks with LoRA adapters, default
// models_interval 10 s); a replay of valid adapter requests running from
// before the first replica until after the last gets no 404: a name no
// known list names is 503 model_unavailable while a replica's list is
// unknown, and a replica's list is read as soon as it is up. The mocks
// answer every name: the test is about turnout's answer; requests HAProxy
// sent to a replica lacking the adapter (its own health view lags
// turnout's, docs/reliability.md) are counted and logged.
func TestReadyBeforeReplicasLoRA(t *testing.T) {
	NeedHAProxy(t)
	placeholders := make([]*Mock, len(loraSets))
	for i := range placeholders {
		placeholders[i] = &Mock{Name: fmt.Sprintf("late-%d", i), Addr: FreeAddr(t)}
	}
	s := &hstack{
		t: t, dir: t.TempDir(), turnoutAddr: FreeAddr(t), haAddr: FreeAddr(t), syslog: FreeUDPAddr(t),
		failMode: "open", spoeAddr: spoeDefault, deps: []depSpec{{name: "llama", policy: policyLeast, mocks: placeholders}},
		client: &http.Client{Timeout: 30 * time.Second},
	}
	s.T = StartTurnout(t, s.turnoutAddr, s.yaml(), "--haproxy-dir", s.dir, "--watch", "100ms")
	s.H = StartRenderedHAProxy(t, s.dir, s.haAddr)
	if code, body := getReadyz(t, s.T.URL); code != 503 {
		t.Fatalf("ready before any replica: %d %q", code, body)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	statuses := map[int]int{}
	var first404 string
	var okAfterAll, misplaced atomic.Int64
	var allUp atomic.Bool
	var wg sync.WaitGroup
	adapters := []string{"a1", "a2", "a3", "a4"}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				a := adapters[(w+i)%len(adapters)]
				r, err := Post(ctx, s.client, s.H.URL+"/v1/chat/completions", chatBody(a, "sys", fmt.Sprintf("w%d q%d", w, i), false), nil)
				if ctx.Err() != nil {
					return
				}
				code := 0
				if err == nil {
					code = r.Status
				}
				mu.Lock()
				statuses[code]++
				if code == 404 && first404 == "" {
					first404 = fmt.Sprintf("%s: %s (replica %q)", a, r.Body, r.Header.Get("X-Replica"))
				}
				mu.Unlock()
				if code == 200 && allUp.Load() {
					okAfterAll.Add(1)
				}
				if code == 200 {
					if n := strings.TrimPrefix(r.Header.Get("X-Replica"), "late-"); len(n) == 1 && !slices.Contains(loraSets[n[0]-'0'], a) {
						misplaced.Add(1)
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the replay runs while no replica exists
	for i, set := range loraSets {
		StartMockAt(t, placeholders[i].Name, placeholders[i].Addr, func(c *mock.Config) {
			c.Models = []string{"llama"}
			c.MaxLoRAs = 2
			for _, a := range set {
				c.LoRAModules = append(c.LoRAModules, mock.LoRAModule{Name: a, Path: "/adapters/" + a})
			}
		})
		time.Sleep(300 * time.Millisecond) // replicas come up one by one
	}
	allUp.Store(true)
	Eventually(t, 30*time.Second, "adapter requests served once every replica is up", func() bool { return okAfterAll.Load() >= 200 })
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("replay statuses: %v; %d served by a replica lacking the adapter (HAProxy balanced: turnout's pick not up in its view yet)", statuses, misplaced.Load())
	if statuses[404] != 0 {
		t.Errorf("%d of the replay's valid adapter requests got 404, first: %s", statuses[404], first404)
	}
	if code, body := getReadyz(t, s.T.URL); code != 200 {
		t.Errorf("not ready with every replica up: %d %q", code, body)
	}
}
