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
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// Flow control end to end (issue 26): two mock replicas of 8 running
// sequences each, driven at about 1.5x their capacity with three classes
// and five tenants (one sending 10x the others), through a real proxy.

// flowMocks: ~250 ms TTFT, ~410 ms per request, 8 running per replica
// (the rest would wait in the engine): 2 x 8 / 0.41 s = ~39 requests/s.
func flowMocks(t *testing.T, prefix string) []*Mock {
	return mocks(t, prefix, 2, func(c *mock.Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 250 * time.Millisecond
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 10 * time.Millisecond
		c.MaxRunning = 8
	})
}

// flowYAML holds standard traffic at 6 per replica and lets critical use
// the 7th and 8th (headroom 2), what the engines run: nothing waits in an
// engine, critical requests (1.6 running on average) overtake the held
// standard ones and rarely wait for a completion. (Held at 8 without a
// headroom, critical TTFT p99 was 1.6-1.7x its unloaded value here: it
// waited for the next completion; with a headroom of 1, 1.2-1.8x on the
// shared VM.)
var flowYAML = []string{
	"flow_control:",
	"  trust: {priority_header: true, tenant_header: true}", // the test clients stand for the operator's ingress
	"  saturation: {max_load: 6}",
	"  classes:",
	"    - {name: critical, max_wait: 20s, headroom: 2}",
	"    - {name: standard, max_wait: 20s}",
	"    - {name: sheddable, max_wait: 200ms, shed: true}",
}

const flowCapacity = 2 * 8 / 0.41 // requests per second

// flowResult is one request of the load: what it was and what it got.
type flowResult struct {
	class, tenant string
	status        int
	ttft          time.Duration
	retryAfter    string
	body          []byte
	err           error
}

// flowPost sends one streamed chat request and times its first byte.
func flowPost(ctx context.Context, c *http.Client, url, model, class, tenant string) flowResult {
	r := flowResult{class: class, tenant: tenant}
	body, _ := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": "hello " + tenant}},
		"max_tokens": 16,
		"stream":     true,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Priority", class)
	if tenant != "" {
		req.Header.Set("X-Tenant-Id", tenant)
	}
	start := time.Now()
	res, err := c.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer res.Body.Close()
	r.status, r.retryAfter = res.StatusCode, res.Header.Get("Retry-After")
	br := bufio.NewReader(res.Body)
	first, err := br.ReadByte()
	if err != nil {
		r.err = fmt.Errorf("first byte: %w", err)
		return r
	}
	r.ttft = time.Since(start)
	rest, err := io.ReadAll(br)
	if err != nil {
		r.err = fmt.Errorf("body: %w", err)
	}
	r.body = append([]byte{first}, rest...)
	return r
}

// flowLoad runs the mixed load for d at rate requests/s (open loop).
func flowLoad(t *testing.T, url, model string, rate float64, d time.Duration) []flowResult {
	t.Helper()
	// 58 slots of a cycle: critical 4, sheddable 8, standard 46 of which
	// the tenant "big" sends 10 parts and a..d one each.
	var plan []struct{ class, tenant string }
	add := func(n int, class, tenant string) {
		for range n {
			plan = append(plan, struct{ class, tenant string }{class, tenant})
		}
	}
	add(4, "critical", "ops")
	add(8, "sheddable", "batch")
	add(33, "standard", "big")
	for _, tn := range []string{"a", "b", "c", "d"} {
		add(3, "standard", tn)
	}
	// Interleaved the same way every run.
	order := rand.New(rand.NewPCG(1, 2)).Perm(len(plan))
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	n := int(rate * d.Seconds())
	out := make([]flowResult, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
		p := plan[order[i%len(order)]]
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = flowPost(context.Background(), c, url, model, p.class, p.tenant)
		}()
	}
	wg.Wait()
	return out
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// checkFlowControl is the acceptance check, through any front.
func checkFlowControl(t *testing.T, frontURL, turnoutURL, model string) {
	c := &http.Client{Timeout: 30 * time.Second}
	// Unloaded: critical requests one at a time.
	var idle []time.Duration
	for range 20 {
		r := flowPost(context.Background(), c, frontURL, model, "critical", "ops")
		if r.err != nil || r.status != 200 {
			t.Fatalf("unloaded request: %d %v %s", r.status, r.err, r.body)
		}
		idle = append(idle, r.ttft)
	}
	idleP99 := quantile(idle, 0.99)

	res := flowLoad(t, frontURL, model, 1.5*flowCapacity, 5*time.Second)

	ttft := map[string][]time.Duration{}
	statuses := map[string]map[int]int{}
	for _, r := range res {
		if r.err != nil {
			t.Errorf("%s/%s: %v (every request must be answered)", r.class, r.tenant, r.err)
			continue
		}
		key := r.class + "/" + r.tenant
		if statuses[key] == nil {
			statuses[key] = map[int]int{}
		}
		statuses[key][r.status]++
		switch {
		case r.status == 200:
			ttft[key] = append(ttft[key], r.ttft)
		case r.status == 429 && r.class == "sheddable":
			if r.retryAfter == "" {
				t.Errorf("429 without Retry-After")
			}
			var e struct {
				Error struct{ Type, Code, Message string }
			}
			if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Code != "flow_shed" || e.Error.Type != "rate_limit_exceeded" {
				t.Errorf("429 body is not an OpenAI-style flow_shed error: %s", r.body)
			}
		default:
			t.Errorf("%s: status %d %s (only sheddable requests may fail, with 429)", key, r.status, r.body)
		}
	}
	t.Logf("statuses: %v", statuses)
	critP99 := quantile(ttft["critical/ops"], 0.99)
	t.Logf("critical TTFT: unloaded p99 %v, loaded p50 %v p99 %v (%d requests)", idleP99, quantile(ttft["critical/ops"], 0.5), critP99, len(ttft["critical/ops"]))
	for _, k := range []string{"standard/big", "standard/a", "standard/b", "standard/c", "standard/d"} {
		t.Logf("%s TTFT p50 %v p90 %v (%d served)", k, quantile(ttft[k], 0.5), quantile(ttft[k], 0.9), len(ttft[k]))
	}
	if critP99 > idleP99*3/2 {
		t.Errorf("critical TTFT p99 %v over 1.5x its unloaded p99 %v", critP99, idleP99)
	}
	if statuses["sheddable/batch"][429] == 0 {
		t.Errorf("no sheddable request was shed at 1.5x capacity: %v", statuses["sheddable/batch"])
	}
	// Fairness: the small tenants wait a round, not behind the big one's backlog.
	bigP50 := quantile(ttft["standard/big"], 0.5)
	if std := quantile(ttft["standard/big"], 0.9); std < idleP99*2 {
		t.Errorf("standard p90 %v: the load did not make standard traffic queue", std)
	}
	for _, tn := range []string{"a", "b", "c", "d"} {
		if p := quantile(ttft["standard/"+tn], 0.9); p > bigP50 {
			t.Errorf("tenant %s p90 TTFT %v above the 10x tenant's median %v: not a fair share", tn, p, bigP50)
		}
	}
	// Every held request was served or answered: nothing is held now, and
	// turnout counted as many outcomes as requests were sent.
	Eventually(t, 10*time.Second, "flow queue empty", func() bool {
		q, err := Metric(t, turnoutURL+"/metrics", "turnout_flow_queued")
		return err == nil && q == 0
	})
	total, err := Metric(t, turnoutURL+"/metrics", "turnout_flow_requests_total")
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(len(res) + len(idle)); total != want {
		t.Errorf("turnout counted %v flow outcomes for %v requests", total, want)
	}
	released, _ := Metric(t, turnoutURL+"/metrics", "turnout_flow_requests_total", `outcome="released"`)
	if released == 0 {
		t.Error("nothing was held and released")
	}
	rBig, _ := Metric(t, turnoutURL+"/metrics", "turnout_flow_requests_total", `tenant="big"`, `outcome="released"`)
	rA, _ := Metric(t, turnoutURL+"/metrics", "turnout_flow_requests_total", `tenant="a"`, `outcome="released"`)
	t.Logf("released: all %v, big %v, a %v", released, rBig, rA)
}

func TestFlowControlHAProxySPOE(t *testing.T) {
	ms := flowMocks(t, "fl")
	s := startStackWith(t, "open", spoeDefault, depSpec{name: "fl", policy: policyLeast, mocks: ms, depYAML: flowYAML})
	checkFlowControl(t, s.H.URL, s.T.URL, "fl")
}

func TestFlowControlNginx(t *testing.T) {
	ms := flowMocks(t, "fn")
	s := (&nstack{failMode: "open", deps: []ndep{{name: "fn", policy: policyLeast, mode: "body", mocks: ms, depYAML: flowYAML}}}).start(t)
	checkFlowControl(t, s.N.URL, s.T.URL, "fn")
}

// A held request whose client goes away leaves the queue: in header mode
// (auth_request) nginx closes its call to turnout, and turnout sees the
// socket close while holding it; body mode (njs) is the exception below.
func TestFlowControlNginxClientGone(t *testing.T) {
	for _, mode := range []string{"header", "body"} {
		t.Run(mode, func(t *testing.T) { testFlowNginxClientGone(t, mode) })
	}
}

func testFlowNginxClientGone(t *testing.T, mode string) {
	ms := goneMocks(t, "fg")
	s := (&nstack{failMode: "open", deps: []ndep{{name: "fg", policy: policyLeast, mode: mode, mocks: ms, depYAML: flowYAML}}}).start(t)
	checkClientGone(t, s.N.URL, s.T.URL, "fg", mode == "header")
}

// Through HAProxy: the Lua action's httpclient call and the SPOE frame.
// HAProxy 2.6 tells neither that the client left (see
// docs/flow-control.md): the request is released in its turn and its
// decision closes.
func TestFlowControlHAProxyClientGone(t *testing.T) {
	for _, path := range []string{"lua", "spoe"} {
		t.Run(path, func(t *testing.T) {
			spoe := ""
			if path == "spoe" {
				spoe = spoeDefault
			}
			ms := goneMocks(t, "fh")
			s := startStackWith(t, "open", spoe, depSpec{name: "fh", policy: policyLeast, mocks: ms, depYAML: flowYAML})
			checkClientGone(t, s.H.URL, s.T.URL, "fh", false)
		})
	}
}

// goneMocks run requests for about 32 s: nothing frees while a test looks,
// even on a loaded machine (a CPU hog on both cores) where filling the
// replicas and queueing one more request take many seconds; the test frees
// them by cancelling its busy requests when it is done looking.
func goneMocks(t *testing.T, prefix string) []*Mock {
	return mocks(t, prefix, 2, func(c *mock.Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 250 * time.Millisecond
		c.InterTokenLatency = 2 * time.Second
		c.MaxRunning = 8
	})
}

// checkClientGone fills the replicas to max_load, holds one more request
// and cancels it. dropped: turnout must see the client leave and drop the
// request; otherwise it must release it once the replicas free and its
// decision must close (nothing hangs, no phantom in-flight request).
func checkClientGone(t *testing.T, frontURL, turnoutURL, model string, dropped bool) {
	c := &http.Client{Timeout: 60 * time.Second}
	busy, freeReplicas := context.WithCancel(context.Background())
	defer freeReplicas()
	var wg sync.WaitGroup
	sent := 0
	sendBusy := func() {
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			flowPost(busy, c, frontURL, model, "standard", "busy")
		}()
	}
	for range 12 { // 2 replicas x max_load 6
		sendBusy()
	}
	// Flow control balances on the engine-reported load: a scrape taken
	// while a busy request was decided but not yet running at its replica
	// undercounts, and the next request would be let through instead of
	// held. Wait for a scrape that sees every replica at max_load. On a
	// starved machine the policy's view can lag too and place 7 and 5: then
	// the replica below max_load gets one more busy request, as many times
	// as it takes (a held busy request would also do: saturated).
	load := func(ep string) (inflight, engine, load float64, ok bool) {
		sel := `endpoint="` + ep + `"`
		v, err1 := Metric(t, turnoutURL+"/metrics", "turnout_endpoint_inflight", sel)
		e, err2 := Metric(t, turnoutURL+"/metrics", "turnout_endpoint_engine_requests", sel)
		l, err3 := Metric(t, turnoutURL+"/metrics", "turnout_endpoint_load", sel)
		return v, e, l, err1 == nil && err2 == nil && err3 == nil
	}
	Eventually(t, 30*time.Second, "every replica at max_load, as its engine reports it", func() bool {
		v0, e0, l0, ok0 := load(model + "-0")
		v1, e1, l1, ok1 := load(model + "-1")
		if !ok0 || !ok1 {
			return false
		}
		if min(v0, e0, l0) >= 6 && min(v1, e1, l1) >= 6 {
			return true
		}
		if q, err := Metric(t, turnoutURL+"/metrics", "turnout_flow_queued", `tenant="busy"`); err == nil && q >= 1 {
			return min(e0, l0) >= 6 && min(e1, l1) >= 6 // the extra one is held: saturated
		}
		if int(v0+v1) == sent && int(e0+e1) == sent && (v0 < 6 || v1 < 6) && sent < 16 {
			sendBusy() // all placed and running, one replica short
		}
		return false
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan flowResult, 1)
	go func() { done <- flowPost(ctx, c, frontURL, model, "standard", "leaver") }()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if v, err := Metric(t, turnoutURL+"/metrics", "turnout_flow_queued", `tenant="leaver"`); err == nil && v == 1 {
			break
		}
		if time.Now().After(deadline) {
			logFlowMetrics(t, turnoutURL)
			t.Fatal("timed out after 15s waiting for the request held")
		}
	}
	cancel()
	<-done
	if !dropped {
		freeReplicas()
		wg.Wait()
		Eventually(t, 30*time.Second, "the left request released and its decision closed", func() bool {
			q, err1 := Metric(t, turnoutURL+"/metrics", "turnout_flow_queued")
			in, err2 := Metric(t, turnoutURL+"/metrics", "turnout_endpoint_inflight")
			return err1 == nil && err2 == nil && q == 0 && in == 0
		})
		g, _ := Metric(t, turnoutURL+"/metrics", "turnout_flow_requests_total", `tenant="leaver"`, `outcome="gone"`)
		t.Logf("gone seen by turnout: %v", g)
		return
	}
	Eventually(t, 10*time.Second, "the held request dropped as gone", func() bool {
		v, err := Metric(t, turnoutURL+"/metrics", "turnout_flow_requests_total", `tenant="leaver"`, `outcome="gone"`)
		return err == nil && v == 1
	})
	if q, _ := Metric(t, turnoutURL+"/metrics", "turnout_flow_queued"); q != 0 {
		t.Fatalf("%v requests still held", q)
	}
	if v, _ := Metric(t, turnoutURL+"/metrics", "turnout_flow_requests_total", `tenant="leaver"`, `outcome="released"`); v != 0 {
		t.Fatalf("the gone request was released %v times", v)
	}
	freeReplicas()
	wg.Wait()
}

// The Lua action's path: the HTTP transport holds the call.
func TestFlowControlHAProxyLua(t *testing.T) {
	ms := flowMocks(t, "fu")
	s := startStackWith(t, "open", "", depSpec{name: "fu", policy: policyLeast, mocks: ms, depYAML: flowYAML})
	checkFlowControl(t, s.H.URL, s.T.URL, "fu")
}

// logFlowMetrics logs turnout's flow control, in-flight and refusal series:
// what a failed wait on a held request needs to be read.
func logFlowMetrics(t *testing.T, turnoutURL string) {
	t.Helper()
	r, err := http.Get(turnoutURL + "/metrics")
	if err != nil {
		t.Logf("metrics: %v", err)
		return
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "#") && (strings.Contains(l, "turnout_flow_") || strings.Contains(l, "inflight") ||
			strings.Contains(l, "engine_requests") || strings.Contains(l, "refusals") || strings.Contains(l, "turnout_endpoint_load")) {
			t.Log(l)
		}
	}
}
