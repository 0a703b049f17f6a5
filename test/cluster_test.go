//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/natstest"
)

// Issue 11: several HAProxy + turnout fronts before the same replicas, with
// engine-reported load and prefix decisions shared over NATS.

// clusterPolicy: the default load guard (balance_abs 4, balance_rel 1.5)
// plus the bounded-load guard that evens out request counts across fronts
// (bounded_load 0.5, chosen on this replay: BENCHMARKS.md).
const clusterPolicy = "{name: prefix-affinity, params: {block_bytes: 64, match_threshold: 0.5, bounded_load: 0.5}}"

// StartNATS runs nats-server on a loopback port (0 = a free one): the
// same helper as route/cluster's tests (lab/testenv/natstest).
func StartNATS(t testing.TB, port int) *natstest.Server { return natstest.Start(t, port) }

// startFront starts one HAProxy + turnout front over mocks, with extra
// top-level YAML (cluster:, engine_metrics:).
func startFront(t *testing.T, name, extra string, ms []*Mock) *hstack {
	t.Helper()
	return startFrontPolicy(t, name, extra, clusterPolicy, ms)
}

// startFrontPolicy is startFront with another policy.
func startFrontPolicy(t *testing.T, name, extra, policy string, ms []*Mock) *hstack {
	t.Helper()
	NeedHAProxy(t)
	s := &hstack{
		t: t, dir: t.TempDir(), turnoutAddr: FreeAddr(t), haAddr: FreeAddr(t), syslog: FreeUDPAddr(t),
		failMode: "open", deps: []depSpec{{name: "llama", policy: policy, mocks: ms}},
		client: &http.Client{Timeout: 30 * time.Second},
	}
	y := strings.Replace(s.yaml(), "deployments:\n", extra+"deployments:\n", 1)
	s.T = StartTurnout(t, s.turnoutAddr, y, "--haproxy-dir", s.dir, "--watch", "100ms")
	s.T.Proc.Name = "turnout-" + name
	s.H = StartRenderedHAProxy(t, s.dir, s.haAddr)
	s.H.WaitServersUp(t, serverIDs("llama_mixed", ms)...)
	return s
}

func clusterYAML(url, name string) string {
	return fmt.Sprintf("cluster: {nats: %q, name: %s}\n", url, name)
}

// clusterMocks are replicas that take a few ms per request and queue beyond
// 4 running sequences, so engine loads mean something.
func clusterMocks(t *testing.T, prefix string) []*Mock {
	return clusterMocksScaled(t, prefix, 0.1)
}

// clusterMocksScaled are clusterMocks at another mock time scale.
func clusterMocksScaled(t *testing.T, prefix string, timeScale float64) []*Mock {
	return mocks(t, prefix, 4, func(c *mock.Config) {
		c.TimeScale = timeScale
		c.MaxRunning = 4
	})
}

// workload is docs x reps requests sharing a long per-document system
// prompt, in a fixed shuffled order.
type workload struct{ bodies [][]byte }

func newWorkload(docs, reps int) *workload {
	w := &workload{}
	rng := rand.New(rand.NewPCG(11, 12))
	var order []int
	for d := 0; d < docs; d++ {
		for r := 0; r < reps; r++ {
			order = append(order, d)
		}
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for i, d := range order {
		sys := fmt.Sprintf("document %d. %s", d, strings.Repeat(fmt.Sprintf("paragraph about topic %d ", d), 40))
		w.bodies = append(w.bodies, chatBody("llama", sys, fmt.Sprintf("question %d about it", i), false))
	}
	return w
}

// replayResult counts outcomes per front.
type replayResult struct {
	ok, failed [2]atomic.Int64
}

// replay sends the workload with conc workers; request i goes to
// fronts[i%len(fronts)] unless that front is gone (gone[k] set), in which
// case it goes to the next. hook runs before request i is handed out.
func replay(t *testing.T, w *workload, fronts []*hstack, conc int, gone []atomic.Bool, hook func(i int)) *replayResult {
	return replayInto(t, &replayResult{}, w, fronts, conc, gone, hook)
}

func replayInto(t *testing.T, res *replayResult, w *workload, fronts []*hstack, conc int, gone []atomic.Bool, hook func(i int)) *replayResult {
	idx := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				k := i % len(fronts)
				for gone != nil && gone[k].Load() {
					k = (k + 1) % len(fronts)
				}
				r, err := Post(context.Background(), fronts[k].client, fronts[k].H.URL+"/v1/chat/completions", w.bodies[i], nil)
				if err != nil || r.Status != 200 {
					res.failed[k].Add(1)
					if gone != nil && gone[k].Load() {
						continue // this front was killed under the request
					}
					if err != nil {
						t.Logf("request %d via front %d: %v", i, k, err)
					} else {
						t.Logf("request %d via front %d: status %d %s", i, k, r.Status, r.Body)
					}
					continue
				}
				res.ok[k].Add(1)
			}
		}()
	}
	for i := range w.bodies {
		if hook != nil {
			hook(i)
		}
		idx <- i
	}
	close(idx)
	wg.Wait()
	return res
}

// hitAndBalance reads the replicas' own counters: prefix-cache hit ratio
// and requests max/mean.
func hitAndBalance(ms []*Mock) (hit, maxMean float64, reqs []int64) {
	var cached, prompt, total, most int64
	for _, m := range ms {
		st := m.Stats()
		cached += st.CachedTokens
		prompt += st.PromptTokens
		total += st.Requests
		most = max(most, st.Requests)
		reqs = append(reqs, st.Requests)
	}
	return float64(cached) / float64(prompt), float64(most) / (float64(total) / float64(len(ms))), reqs
}

// Done-when 1 and 3: the two-front replay against one front, with sync off
// and on; then a replica loaded directly is avoided by both fronts.
func TestClusterTwoFronts(t *testing.T) {
	ns := StartNATS(t, 0)
	const docs, reps, conc = 192, 3, 8
	w := newWorkload(docs, reps)

	ms1 := clusterMocks(t, "one")
	one := startFront(t, "one", "", ms1)
	r1 := replay(t, w, []*hstack{one}, conc, nil, nil)
	hit1, bal1, req1 := hitAndBalance(ms1)

	msOff := clusterMocks(t, "off")
	offA, offB := startFront(t, "off-a", "", msOff), startFront(t, "off-b", "", msOff)
	rOff := replay(t, w, []*hstack{offA, offB}, conc, nil, nil)
	hitOff, balOff, reqOff := hitAndBalance(msOff)

	msOn := clusterMocks(t, "on")
	onA := startFront(t, "on-a", clusterYAML(ns.URL, "front-a"), msOn)
	onB := startFront(t, "on-b", clusterYAML(ns.URL, "front-b"), msOn)
	for _, f := range []*hstack{onA, onB} {
		Eventually(t, 10*time.Second, "cluster connected", func() bool {
			v, err := Metric(t, f.T.URL+"/metrics", "turnout_cluster_connected")
			return err == nil && v == 1
		})
	}
	rOn := replay(t, w, []*hstack{onA, onB}, conc, nil, nil)
	hitOn, balOn, reqOn := hitAndBalance(msOn)

	t.Logf("two-front replay, %d requests (%d documents x %d), %d concurrent, 4 replicas:", len(w.bodies), docs, reps, conc)
	t.Logf("| setup | hit ratio | vs 1 stack | requests max/mean | per replica |")
	t.Logf("| 1 stack | %.3f | 1.00 | %.3f | %v |", hit1, bal1, req1)
	t.Logf("| 2 stacks, no sync | %.3f | %.2f | %.3f | %v |", hitOff, hitOff/hit1, balOff, reqOff)
	t.Logf("| 2 stacks, sync | %.3f | %.2f | %.3f | %v |", hitOn, hitOn/hit1, balOn, reqOn)
	for _, r := range []*replayResult{r1, rOff, rOn} {
		if f := r.failed[0].Load() + r.failed[1].Load(); f != 0 {
			t.Fatalf("%d requests failed", f)
		}
	}
	if hitOn < 0.95*hit1 {
		t.Errorf("sync on: hit ratio %.3f < 95%% of one stack's %.3f", hitOn, hit1)
	}
	// Issue 11: requests max/mean <= 1.1 with sync. The affinity moves
	// 3-turn documents as a unit and two fronts do not see each other's
	// in-flight requests; the bounded-load guard places new documents by
	// the requests every front sent lately (BENCHMARKS.md: 1.007-1.083 over
	// 16 runs at bounded_load 0.1-1, with the box busy).
	if balOn > 1.1 {
		t.Errorf("sync on: requests max/mean %.3f > 1.1 (one stack %.3f, %v)", balOn, bal1, reqOn)
	}
	if bal1 > 1.1 {
		t.Logf("one stack: requests max/mean %.3f above 1.1 (%v)", bal1, req1)
	}
	applied, err := Metric(t, onB.T.URL+"/metrics", "turnout_cluster_received_total", `result="applied"`)
	if err != nil || applied == 0 {
		t.Errorf("front B applied %v peer decisions (%v)", applied, err)
	}

	t.Run("DirectlyLoadedReplicaAvoided", func(t *testing.T) { checkLoadedReplicaAvoided(t, msOn, onA, onB) })
}

// Done-when 3: 4 running + 20 waiting requests sent straight to one replica
// (no proxy saw them): within one scrape interval both fronts stop sending
// it anything. A replica that sat idle is scraped at gaps up to
// engine_metrics.idle_interval (2 s): then the load is seen within that.
func checkLoadedReplicaAvoided(t *testing.T, ms []*Mock, fronts ...*hstack) {
	busy := ms[1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &http.Client{}
	for i := range 24 {
		go func() {
			b := chatBody("llama", "direct load", fmt.Sprintf("long job %d", i), false)
			b = []byte(strings.Replace(string(b), `"max_tokens":2`, `"max_tokens":2000`, 1))
			_, _ = Post(ctx, c, "http://"+busy.Addr+"/v1/chat/completions", b, nil)
		}()
	}
	Eventually(t, 10*time.Second, "20 waiting on the busy replica", func() bool { return busy.Stats().Waiting == 20 })
	loaded := time.Now()
	// One scrape interval (250 ms) for every front to see it, or the idle
	// gap (up to idle_interval, 2 s) if the replica sat idle, plus the
	// scrape's own round trip.
	for _, f := range fronts {
		Eventually(t, 3*time.Second, "engine load seen", func() bool {
			v, err := Metric(t, f.T.URL+"/metrics", "turnout_endpoint_engine_requests", `endpoint="`+busy.Name+`"`)
			return err == nil && v >= 20
		})
	}
	t.Logf("engine load reached both fronts after %s (scrape interval 250 ms, idle_interval 2 s)", time.Since(loaded))
	before := busy.Stats().Requests
	for i := range 40 {
		f := fronts[i%len(fronts)]
		// Fresh prompts, and the documents the busy replica holds.
		sys := fmt.Sprintf("document %d. %s", i%192, strings.Repeat(fmt.Sprintf("paragraph about topic %d ", i%192), 40))
		r := f.post(t, "/v1/chat/completions", chatBody("llama", sys, "more", false), nil)
		if r.Status != 200 {
			t.Fatalf("request %d: status %d", i, r.Status)
		}
		if got := r.Header.Get("X-Replica"); got == busy.Name {
			t.Fatalf("request %d via front %d went to %s, whose engine reports 20 waiting", i, i%len(fronts), got)
		}
	}
	if got := busy.Stats().Requests - before; got != 0 {
		t.Fatalf("busy replica got %d new requests", got)
	}
}

// Done-when 1 (second half) and 2: NATS killed and restarted mid-run, then
// one front killed: no request fails on the surviving front, decisions go
// on, sync resumes and /metrics shows the gap.
func TestClusterOutages(t *testing.T) {
	ns := StartNATS(t, 0)
	w := newWorkload(48, 6)
	ms := clusterMocks(t, "out")
	a := startFront(t, "a", clusterYAML(ns.URL, "front-a"), ms)
	b := startFront(t, "b", clusterYAML(ns.URL, "front-b"), ms)
	connected := func(f *hstack) func() bool {
		return func() bool {
			v, err := Metric(t, f.T.URL+"/metrics", "turnout_cluster_connected")
			return err == nil && v == 1
		}
	}
	Eventually(t, 10*time.Second, "a connected", connected(a))
	Eventually(t, 10*time.Second, "b connected", connected(b))
	gone := make([]atomic.Bool, 2)
	n := len(w.bodies)
	var appliedAtRestart float64
	var nats2 *natstest.Server
	var failedBeforeKill int64
	res := &replayResult{}
	replayInto(t, res, w, []*hstack{a, b}, 8, gone, func(i int) {
		switch i {
		case n / 4:
			ns.Stop()
			Eventually(t, 10*time.Second, "a sees NATS down", func() bool { return !connected(a)() })
		case n / 2:
			nats2 = StartNATS(t, ns.Port)
			Eventually(t, 10*time.Second, "a reconnected", connected(a))
			Eventually(t, 10*time.Second, "b reconnected", connected(b))
			appliedAtRestart, _ = Metric(t, a.T.URL+"/metrics", "turnout_cluster_received_total", `result="applied"`)
		case 3 * n / 4:
			failedBeforeKill = res.failed[1].Load()
			gone[1].Store(true)
			b.H.Stop()
			b.T.Stop()
		}
	})
	_ = nats2
	if f := res.failed[0].Load(); f != 0 {
		t.Fatalf("%d requests failed on front a", f)
	}
	if failedBeforeKill != 0 {
		t.Fatalf("%d requests failed on front b before it was killed", failedBeforeKill)
	}
	// Only requests in flight on b when it was killed may fail (the client
	// of a dead front sees its connection drop).
	if lost := res.failed[1].Load(); lost > 8 {
		t.Fatalf("%d requests failed on front b, more than were in flight when it was killed", lost)
	}
	t.Logf("front a answered %d, front b %d (%d in flight on b when it was killed)", res.ok[0].Load(), res.ok[1].Load(), res.failed[1].Load())
	applied, err := Metric(t, a.T.URL+"/metrics", "turnout_cluster_received_total", `result="applied"`)
	if err != nil || applied <= appliedAtRestart {
		t.Fatalf("sync did not resume after NATS came back: applied %v then %v (%v)", appliedAtRestart, applied, err)
	}
	gap, _ := Metric(t, a.T.URL+"/metrics", "turnout_cluster_disconnected_seconds_total")
	disc, _ := Metric(t, a.T.URL+"/metrics", "turnout_cluster_disconnects_total")
	dropped, _ := Metric(t, a.T.URL+"/metrics", "turnout_cluster_decisions_total", `result="dropped_disconnected"`)
	t.Logf("front a: disconnects %v, gap %.2fs, decisions not shared during the gap %v", disc, gap, dropped)
	if disc < 1 || gap <= 0 {
		t.Fatalf("the NATS gap is not in /metrics: disconnects %v, disconnected seconds %v", disc, gap)
	}
}

// Done-when 4: endpoints whose /metrics is garbage, 10 MB, stalled or
// missing: decisions keep flowing at once, each failure is counted by kind
// and logged once.
func TestEngineMetricsBadPages(t *testing.T) {
	stall := make(chan struct{})
	defer close(stall)
	handlers := map[string]http.HandlerFunc{
		"garbage": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("\x00\x01 {{{ not prometheus\n")) },
		"huge": func(w http.ResponseWriter, _ *http.Request) {
			line := []byte("vllm:num_requests_running 1\n")
			for n := 0; n < 10<<20; n += len(line) {
				if _, err := w.Write(line); err != nil {
					return
				}
			}
		},
		"stall": func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-stall:
			case <-r.Context().Done():
			}
		},
		"missing": http.NotFound,
	}
	want := map[string]string{"garbage": "parse_error", "huge": "too_large", "stall": "timeout", "missing": "http_status"}
	var eps strings.Builder
	for _, name := range []string{"garbage", "huge", "stall", "missing"} {
		ln, err := net.Listen("tcp", FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: handlers[name]}
		go func() { _ = hs.Serve(ln) }()
		t.Cleanup(func() { _ = hs.Close() })
		fmt.Fprintf(&eps, "          - {name: %s, address: %q}\n", name, ln.Addr().String())
	}
	addr := FreeAddr(t)
	tu := StartTurnout(t, addr, fmt.Sprintf(`listen: %s
health: {disable: true}
feedback: {disable: true}
engine_metrics: {interval: 500ms, timeout: 2s, max_bytes: 1048576}
deployments:
  - name: llama
    policy: {name: least-request}
    pools:
      - role: mixed
        endpoints:
%s`, addr, eps.String()))
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for n := 0; time.Now().Before(deadline) || n < 50; n++ {
		r, err := Post(context.Background(), c, tu.URL+"/internal/route", chatBody("llama", "s", "q", false), nil)
		if err != nil || r.Status != 200 {
			t.Fatalf("decision %d: %v %v", n, err, r)
		}
		// A decision held by a scrape would take the 2 s scrape timeout.
		if r.Dur > time.Second {
			t.Fatalf("decision %d took %s while scrapes fail", n, r.Dur)
		}
	}
	for ep, res := range want {
		Eventually(t, 15*time.Second, ep+" counted as "+res, func() bool {
			v, err := Metric(t, tu.URL+"/metrics", "turnout_engine_scrapes_total", `endpoint="`+ep+`"`, `result="`+res+`"`)
			return err == nil && v >= 2
		})
	}
	log, _ := os.ReadFile(tu.Log)
	if got := strings.Count(string(log), "scrape failing"); got != 4 {
		t.Fatalf("%d 'scrape failing' log lines for 4 endpoints failing repeatedly, want 4:\n%s", got, log)
	}
	if !tu.Exited() {
		return
	}
	t.Fatal("turnout exited")
}
