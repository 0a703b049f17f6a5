//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// Issue 28 items 2, 5 and 6 end to end, as the hostile probe ran them:
// forged feedback lines against a stalled replica, a stall that keeps
// /health and /metrics answering, duplicate "model" keys through both
// proxies, and the in-flight gauge after a feedback gap.

// traffic sends one request every `every` to url until stop, counting
// failures and, after mark is set, which replica served each request.
type traffic struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	served   map[string]int
	mark     atomic.Int64
	failures atomic.Int64
	// fastAfter set: answers within fastBound to requests sent after it,
	// by replica.
	fastAfter atomic.Int64
	fastBound time.Duration
	fast      map[string]int
}

// user gives request i's user message (nil: its number).
func startTraffic(url, model string, every time.Duration, user func(int) string) *traffic {
	if user == nil {
		user = func(i int) string { return fmt.Sprint(i) }
	}
	g := &traffic{stop: make(chan struct{}), served: map[string]int{}, fast: map[string]int{}, fastBound: 500 * time.Millisecond}
	client := &http.Client{Timeout: 60 * time.Second}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		tk := time.NewTicker(every)
		defer tk.Stop()
		for i := 0; ; i++ {
			select {
			case <-g.stop:
				return
			case <-tk.C:
			}
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				sent := time.Now().UnixNano()
				r, err := Post(context.Background(), client, url, chatBody(model, "s", user(i), false), nil)
				if err != nil || r.Status != 200 {
					g.failures.Add(1)
					return
				}
				g.mu.Lock()
				if m := g.mark.Load(); m != 0 && sent > m {
					g.served[r.Header.Get(mock.HeaderReplica)]++
				}
				if f := g.fastAfter.Load(); f != 0 && sent > f && r.Dur < g.fastBound {
					g.fast[r.Header.Get(mock.HeaderReplica)]++
				}
				g.mu.Unlock()
			}()
		}
	}()
	return g
}

// servedSince counts the replicas of the requests sent during d from now.
func (g *traffic) servedSince(d time.Duration) (map[string]int, int) {
	g.mark.Store(time.Now().UnixNano())
	time.Sleep(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	out, n := map[string]int{}, 0
	for k, v := range g.served {
		out[k] = v
		n += v
	}
	return out, n
}

// halt stops the traffic after clearing the replicas' faults (a stalled
// request then still waits out its stall).
func (g *traffic) halt(ms []*Mock) {
	close(g.stop)
	for _, m := range ms {
		_ = m.SetFaults(mock.Faults{})
	}
	g.wg.Wait()
}

// Item 2: with the default config (feedback.token_file created beside it),
// forged `id=- srv=<stalled> status=200 ms=1 ttfb=1` lines every 20 ms,
// both without the token (an attacker's) and with it (a leaked token, or
// the old unauthenticated default), do not keep a stalled replica in
// rotation: it is taken out within the bound of
// TestHAProxyStalledReplicaTakenOut. Without the token default the
// rejected counter stays flat; with `id=-` lines clearing suspicion (the
// old monitor) the replica is never degraded.
func TestHAProxyForgedLinesStalledReplica(t *testing.T) {
	const budget = 2 * time.Second
	ms := mocks(t, "forge", 3, nil)
	s := startStackWith(t, "open", spoeDefault, depSpec{name: "llama", policy: policyLeast, mocks: ms})
	if !strings.Contains(s.yaml(), "feedback: {syslog: "+s.syslog+"}") {
		t.Fatal("the stack's config is not the default feedback config")
	}
	// The forgery goes on without a token file (before the default, any
	// local line was accepted), so that the stall check below still runs.
	tok := s.T.FeedbackToken(t)
	if tok == "" {
		t.Error("no feedback token created beside a config that sets none")
	}
	s.T.Rewrite(t, strings.Replace(s.yaml(), "health: {interval: 300ms, timeout: 300ms}",
		fmt.Sprintf("health: {interval: 300ms, timeout: 300ms, stall: {budget: %s}}", budget), 1))
	Eventually(t, 10*time.Second, "the stall budget to apply", func() bool {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_config_reloads_total", `result="ok"`) >= 2
	})
	g := startTraffic(s.H.URL+"/v1/chat/completions", "llama", 40*time.Millisecond, nil)
	defer g.halt(ms)
	time.Sleep(time.Second) // completions flowing
	stalled := ms[0]
	rejected0 := metricOr0(t, s.T.URL+"/metrics", "turnout_feedback_rejected_total")

	// The forger: loopback, every 20 ms, one line without the token and one
	// with it.
	var forged atomic.Int64
	forgeStop := make(chan struct{})
	forgeDone := make(chan struct{})
	go func() {
		defer close(forgeDone)
		c, err := dialUDP(s.syslog)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		line := "<134>haproxy[1]: turnout-done id=- srv=" + stalled.Name + " status=200 ms=1 ttfb=1"
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-forgeStop:
				return
			case <-tk.C:
			}
			_, _ = c.Write([]byte(line))
			forged.Add(1)
			if tok != "" {
				_, _ = c.Write([]byte(line + " tok=" + tok))
				forged.Add(1)
			}
		}
	}()
	defer func() {
		select {
		case <-forgeStop:
		default:
			close(forgeStop)
		}
		<-forgeDone
	}()
	time.Sleep(200 * time.Millisecond) // forged lines arriving before the stall
	took, degraded := stallUntilDegraded(t, s, stalled, 8*time.Second, 5*budget, "under forged lines")
	t.Logf("stalled replica taken out %v after it began stalling under %d forged lines (budget %v, %.2fx)",
		took.Round(10*time.Millisecond), forged.Load(), budget, took.Seconds()/budget.Seconds())
	// Forged lines go on: the replica stays out.
	got, n := g.servedSince(2 * time.Second)
	if n < 15 || got[stalled.Name] > 0 {
		t.Errorf("after degrading, with forged lines still arriving: served %v, want >= 15 and none by %s", got, stalled.Name)
	}
	if degraded() != 1 {
		t.Errorf("%s readmitted while it still stalls (forged lines)", stalled.Name)
	}
	if r := metricOr0(t, s.T.URL+"/metrics", "turnout_feedback_rejected_total"); tok != "" && r <= rejected0 {
		t.Errorf("turnout_feedback_rejected_total %v -> %v: lines without the default token were accepted", rejected0, r)
	}
	close(forgeStop)
	if took > 2*budget+budget/2 {
		t.Errorf("took %v to take the stalled replica out under forged lines, goal <= 2.5x the %v budget", took, budget)
	}
}

// Item 2, second half: a replica whose completions stall while /health
// and /metrics answer at once (the mock stalls only completions, and a
// stalled request is not counted running, so the engine reports ~0 while
// turnout's open decisions on it grow) is taken out by stall detection,
// not by health checks, within the same bound. Through nginx (body mode).
// It fails if /health stopped answering (the test would prove nothing),
// if the scraped engine load never read below turnout's open decisions,
// or if the replica stays in rotation (a policy trusting the engine's 0).
func TestNginxStallWhileHealthAnswers(t *testing.T) {
	const spareMark = "answer-me-in-time "
	const budget = 2 * time.Second
	ms := mocks(t, "hstall", 3, nil)
	s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "body", mocks: ms})
	s.T.Rewrite(t, strings.Replace(s.yaml(), "health: {interval: 300ms, timeout: 300ms, disable: false}",
		fmt.Sprintf("health: {interval: 300ms, timeout: 300ms, disable: false, stall: {budget: %s}}", budget), 1))
	Eventually(t, 10*time.Second, "the stall budget to apply", func() bool {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_config_reloads_total", `result="ok"`) >= 2
	})
	g := startTraffic(s.N.URL+"/v1/chat/completions", "llama", 10*time.Millisecond, func(i int) string {
		if i%2 == 0 {
			return spareMark + fmt.Sprint(i)
		}
		return fmt.Sprint(i)
	})
	defer g.halt(ms)
	time.Sleep(time.Second)
	stalled := ms[0]
	ep := `endpoint="` + stalled.Name + `"`

	// Watch the replica's own /health and /metrics, and turnout's view of
	// it, every 100 ms during the stall.
	var (
		healthOK, healthBad, pagesOK atomic.Int64
		disagree                     atomic.Int64 // samples with engine < turnout's open decisions - 1
		maxInflight                  atomic.Int64
	)
	watchStop, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		c := &http.Client{Timeout: time.Second}
		for {
			select {
			case <-watchStop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if res, err := c.Get("http://" + stalled.Addr + mock.PathHealth); err == nil && res.StatusCode == 200 {
				res.Body.Close()
				healthOK.Add(1)
			} else {
				if err == nil {
					res.Body.Close()
				}
				healthBad.Add(1)
			}
			if res, err := c.Get("http://" + stalled.Addr + mock.PathMetrics); err == nil && res.StatusCode == 200 {
				res.Body.Close()
				pagesOK.Add(1)
			}
			in := metricOr0(t, s.T.URL+"/metrics", "turnout_endpoint_inflight", ep)
			eng, err := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_engine_requests", ep)
			if err == nil && eng+1 < in {
				disagree.Add(1)
			}
			if int64(in) > maxInflight.Load() {
				maxInflight.Store(int64(in))
			}
		}
	}()
	defer func() {
		select {
		case <-watchStop:
		default:
			close(watchStop)
		}
		<-watchDone
	}()
	healthFails := metricOr0(t, s.T.URL+"/metrics", "turnout_health_checks_total", `result="fail"`)
	start := time.Now()
	g.fastAfter.Store(start.UnixNano())
	// Half the requests stall, half are answered in time (their body
	// carries the spare mark; turnout's stall probes never do). Before the
	// fix each in-time answer made the older open decisions prove nothing.
	if err := stalled.SetFaults(mock.Faults{Stall: 5 * time.Second, StallSpare: spareMark}); err != nil {
		t.Fatal(err)
	}
	degraded := func() float64 { return metricOr0(t, s.T.URL+"/metrics", "turnout_endpoint_degraded", ep) }
	Eventually(t, 5*budget, stalled.Name+" degraded", func() bool { return degraded() == 1 })
	took := time.Since(start)
	g.mu.Lock()
	inTime := g.fast[stalled.Name]
	g.mu.Unlock()
	fails := metricOr0(t, s.T.URL+"/metrics", "turnout_health_checks_total", `result="fail"`) - healthFails
	readyz := getBody(t, s.T.URL+"/readyz?verbose")
	close(watchStop)
	<-watchDone
	t.Logf("taken out %v after the stall began (budget %v, %.2fx); %d answered in time meanwhile; /health %d ok %d not, /metrics %d ok; max %d open decisions, %d samples with the engine reading lower",
		took.Round(10*time.Millisecond), budget, took.Seconds()/budget.Seconds(), inTime, healthOK.Load(), healthBad.Load(), pagesOK.Load(), maxInflight.Load(), disagree.Load())
	if healthBad.Load() != 0 || healthOK.Load() < 5 || pagesOK.Load() < 5 {
		t.Errorf("the stalled replica's /health (%d ok, %d not) or /metrics (%d ok) did not answer throughout", healthOK.Load(), healthBad.Load(), pagesOK.Load())
	}
	if fails != 0 || !strings.Contains(readyz, "endpoint "+stalled.Name) || !strings.Contains(readyz, "stalled past its") {
		t.Errorf("not taken out by stall detection: %v failed health checks during the stall; /readyz?verbose:\n%s", fails, readyz)
	}
	if inTime == 0 {
		t.Errorf("no request answered in time by %s during the stall: not the scenario (a full stall)", stalled.Name)
	}
	if disagree.Load() == 0 {
		t.Errorf("the scraped engine load never read below turnout's open decisions (max %d): not the scenario", maxInflight.Load())
	}
	got, n := g.servedSince(2 * time.Second)
	if n < 30 || got[stalled.Name] > 0 {
		t.Errorf("after degrading: served %v, want >= 30 and none by %s", got, stalled.Name)
	}
	if took > 2*budget+budget/2 {
		t.Errorf("took %v to take the stalled replica out, goal <= 2.5x the %v budget", took, budget)
	}
}

// Item 5 through the proxies: a body with two "model" keys (also spelled
// "mod\u0065l") is refused 400 duplicate_model, OpenAI-style, and reaches
// no replica when the config has several deployments (the model picks the
// pool; vLLM would serve the last key); with one deployment it routes.
// Before the fix the first key routed: 200 from a "llama" replica.
func TestDuplicateModelThroughProxies(t *testing.T) {
	dupBodies := [][]byte{
		[]byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"model":"chat"}`),
		[]byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"mod\u0065l":"chat"}`),
	}
	requests := func(ms ...[]*Mock) int {
		n := 0
		for _, l := range ms {
			for _, m := range l {
				n += int(m.Stats().Requests)
			}
		}
		return n
	}
	check := func(t *testing.T, post func([]byte) *Response, several bool, all ...[]*Mock) {
		for _, b := range dupBodies {
			before := requests(all...)
			var r *Response
			if several {
				r = post(b)
				var e struct {
					Error struct {
						Message, Type, Code string
					}
				}
				if r.Status != 400 || json.Unmarshal(r.Body, &e) != nil || e.Error.Code != "duplicate_model" || e.Error.Message == "" {
					t.Errorf("%s: %d %s, want 400 with an OpenAI-style duplicate_model error", b, r.Status, r.Body)
				}
				if rep := r.Header.Get(mock.HeaderReplica); rep != "" {
					t.Errorf("%s reached replica %s", b, rep)
				}
				if n := requests(all...) - before; n != 0 {
					t.Errorf("%s: replicas got %d requests", b, n)
				}
				continue
			}
			// One deployment: every name is served by the same replicas.
			Eventually(t, 20*time.Second, "the one-deployment config to route "+string(b), func() bool {
				r = post(b)
				return r.Status == 200 && strings.HasPrefix(r.Header.Get(mock.HeaderReplica), all[0][0].Name[:len(all[0][0].Name)-1])
			})
		}
		// One "model" key still routes.
		r := post(chatBody("llama", "s", "u", false))
		if r.Status != 200 || r.Header.Get(mock.HeaderReplica) == "" {
			t.Errorf("one model key: %d %s", r.Status, r.Body)
		}
	}
	t.Run("HAProxySPOE", func(t *testing.T) {
		llama, chat := mocks(t, "hdl", 2, nil), mocks(t, "hdc", 2, nil)
		s := startStackWith(t, "open", spoeDefault,
			depSpec{name: "llama", policy: policyLeast, mocks: llama}, depSpec{name: "chat", policy: policyLeast, mocks: chat})
		post := func(b []byte) *Response { return s.post(t, "/v1/chat/completions", b, nil) }
		check(t, post, true, llama, chat)
		s.deps = s.deps[:1]
		s.T.Rewrite(t, s.yaml())
		check(t, post, false, llama)
	})
	t.Run("NginxBody", func(t *testing.T) {
		llama, chat := mocks(t, "ndl", 2, nil), mocks(t, "ndc", 2, nil)
		s := startNginxStack(t, "open",
			ndep{name: "llama", policy: policyLeast, mode: "body", mocks: llama}, ndep{name: "chat", policy: policyLeast, mode: "body", mocks: chat})
		post := func(b []byte) *Response { return s.post(t, "/v1/chat/completions", b, nil) }
		check(t, post, true, llama, chat)
		s.deps = s.deps[:1]
		s.T.Rewrite(t, s.yaml())
		check(t, post, false, llama)
	})
}

// Item 6: decisions whose completions a feedback outage lost (made through
// /internal/route, as a proxy whose log lines go nowhere would) are closed
// once completions arrive again: within one engine scrape interval of the
// first completion after the gap, each endpoint's in-flight gauge is its
// engine's count (3 streams really running on one replica, 0 on the
// other), not the ~40 decisions the gap left open until decision_ttl
// (10 min, the behaviour before the fix).
func TestHAProxyFeedbackGapReconciled(t *testing.T) {
	const scrape = time.Second
	slow := func(c *mock.Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 10 * time.Millisecond
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 100 * time.Millisecond
	}
	ms := mocks(t, "gap", 2, slow)
	s := startStack(t, "open", depSpec{name: "llama", policy: policyLeast, mocks: ms})
	// A 2 s stall budget ticks the feedback monitor every 500 ms (a quarter
	// of it; 1 s with the default budget), well inside the scrape interval.
	cfg := strings.Replace(s.yaml(), "feedback: {syslog: "+s.syslog+"}",
		fmt.Sprintf("feedback: {syslog: %s, stalled_after: 1s, stalled_min_decisions: 5}\nengine_metrics: {interval: %s}", s.syslog, scrape), 1)
	s.T.Rewrite(t, strings.Replace(cfg, "health: {interval: 300ms, timeout: 300ms}", "health: {interval: 300ms, timeout: 300ms, stall: {budget: 2s}}", 1))
	Eventually(t, 10*time.Second, "the feedback settings to apply", func() bool {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_config_reloads_total", `result="ok"`) >= 2
	})
	inflight := func(m *Mock) float64 {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_endpoint_inflight", `endpoint="`+m.Name+`"`)
	}
	// Feedback works: proxied requests close their decisions.
	for i := range 4 {
		if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", fmt.Sprint(i), false), nil); r.Status != 200 {
			t.Fatalf("proxied request: %d %s", r.Status, r.Body)
		}
	}
	Eventually(t, 5*time.Second, "in-flight 0 through feedback", func() bool { return inflight(ms[0])+inflight(ms[1]) == 0 })

	// The gap: 40 decisions whose completions never come.
	const lost = 40
	for range lost {
		routeOnce(t, s.T.URL)
	}
	// 3 requests really running on ms[0] (sent to it directly: ~8 s
	// streams), so its engine reports 3.
	ctx, cancel := context.WithCancel(context.Background())
	var streams sync.WaitGroup
	defer func() { cancel(); streams.Wait() }()
	for i := range 3 {
		streams.Add(1)
		go func() {
			defer streams.Done()
			b, _ := json.Marshal(map[string]any{"model": "llama", "messages": []map[string]string{{"role": "user", "content": fmt.Sprint("run", i)}}, "max_tokens": 80, "stream": true})
			_, _ = Post(ctx, http.DefaultClient, "http://"+ms[0].Addr+"/v1/chat/completions", b, nil)
		}()
	}
	Eventually(t, 5*time.Second, "the engine scrape to report 3 running on "+ms[0].Name, func() bool {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_endpoint_engine_requests", `endpoint="`+ms[0].Name+`"`) == 3
	})
	Eventually(t, 10*time.Second, "turnout_feedback_stalled 1", func() bool {
		return metricOr0(t, s.T.URL+"/metrics", "turnout_feedback_stalled") == 1
	})
	if in := inflight(ms[0]) + inflight(ms[1]); in != lost {
		t.Fatalf("in flight during the gap: %v, want the %d lost decisions", in, lost)
	}
	// Feedback returns: one proxied request completes.
	if r := s.post(t, "/v1/chat/completions", chatBody("llama", "s", "back", false), nil); r.Status != 200 {
		t.Fatalf("proxied request after the gap: %d %s", r.Status, r.Body)
	}
	back := time.Now()
	Eventually(t, 10*time.Second, "in-flight re-based on the engines' counts", func() bool {
		return inflight(ms[0]) <= 3 && inflight(ms[1]) == 0
	})
	took := time.Since(back)
	t.Logf("in flight right %v after feedback returned (%v on %s, %v on %s; reconciled %v)", took.Round(10*time.Millisecond),
		inflight(ms[0]), ms[0].Name, inflight(ms[1]), ms[1].Name,
		metricOr0(t, s.T.URL+"/metrics", "turnout_completions_total", `result="reconciled"`))
	if took > scrape+500*time.Millisecond {
		t.Errorf("in flight right only %v after feedback returned, goal one scrape interval (%v)", took, scrape)
	}
	if r := metricOr0(t, s.T.URL+"/metrics", "turnout_completions_total", `result="reconciled"`); r < lost-3 {
		t.Errorf("turnout_completions_total{result=\"reconciled\"} %v, want >= %d", r, lost-3)
	}
	if v := metricOr0(t, s.T.URL+"/metrics", "turnout_feedback_stalled"); v != 0 {
		t.Errorf("turnout_feedback_stalled %v after completions returned", v)
	}
}

func dialUDP(addr string) (net.Conn, error) { return net.Dial("udp", addr) }
