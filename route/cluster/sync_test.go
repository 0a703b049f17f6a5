package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/turnout/turnout/route/httpapi"

	"github.com/turnout/turnout/internal/config"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/lab/testenv/natstest"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

const fourEndpoints = `
health: {disable: true}
engine_metrics: {disable: true}
cluster: {nats: %q, name: %s, batch_delay: 2ms}
deployments:
  - name: llama
    policy: {name: prefix-affinity, params: {block_bytes: 64}}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
          - {name: c, address: 127.0.0.1:8003}
          - {name: d, address: 127.0.0.1:8004}
`

type node struct {
	srv  *route.Decider
	api  *httpapi.API
	sync *Sync
	stop context.CancelFunc
}

func startNode(t testing.TB, url, name string) *node {
	t.Helper()
	return startNodeLog(t, url, name, nil)
}

func startNodeLog(t testing.TB, url, name string, log *zerolog.Logger) *node {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(fourEndpoints, url, name)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := route.New(cfg, route.Options{Seed: uint64(len(name)) + 7})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(srv, cfg.Cluster, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx)
	n := &node{srv: srv, api: httpapi.New(srv), sync: s, stop: func() { cancel(); s.Wait(); srv.Close() }}
	t.Cleanup(n.stop)
	return n
}

func prompt(i int) string {
	return fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":"document %d: %s"},{"role":"user","content":"q"}]}`,
		i, strings.Repeat(fmt.Sprintf("chunk-%d ", i), 60))
}

func routeCtx(body, session string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetMethod("POST")
	if session != "" {
		ctx.Request.Header.Set("X-Session-Id", session)
	}
	ctx.Request.SetBodyString(body)
	return &ctx
}

// decide routes one request and completes it; it returns the endpoint.
func decide(t testing.TB, n *node, ctx *fasthttp.RequestCtx) string {
	ctx.Response.Reset()
	n.api.Handler(ctx)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	var id uint64
	fmt.Sscanf(string(ctx.Response.Header.Peek(contract.HdrDecision)), "%x", &id)
	n.srv.Ledger().Complete(id)
	return string(ctx.Response.Header.Peek(contract.HdrServer))
}

func metric(n *node, line string) string {
	var b strings.Builder
	n.sync.WriteMetrics(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, line+" ") {
			return strings.TrimPrefix(l, line+" ")
		}
	}
	return ""
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func applied(n *node) uint64 { return n.sync.recv[recvApplied].Load() }

// idle: n's publisher is parked until the next decision, not waiting to
// send changed levels. The flags are read in the order park clears them.
func idle(n *node) bool { return !n.sync.timed.Load() && n.sync.parked.Load() && !n.sync.timed.Load() }

// A prefix routed by one instance is found by the other: B sends each
// document where A sent it, as a prefix hit, although B never saw it.
func TestSyncSharesPrefixes(t *testing.T) {
	ns := natstest.Start(t, 0)
	a, b := startNode(t, ns.URL, "node-a"), startNode(t, ns.URL, "node-b")
	eventually(t, "both connected", func() bool { return a.sync.Connected() && b.sync.Connected() })
	time.Sleep(50 * time.Millisecond) // subscriptions reach the server
	where := map[int]string{}
	for i := 0; i < 40; i++ {
		where[i] = decide(t, a, routeCtx(prompt(i), ""))
	}
	eventually(t, "B applies A's decisions", func() bool { return applied(b) >= 40 })
	for i := 0; i < 40; i++ {
		if got := decide(t, b, routeCtx(prompt(i), "")); got != where[i] {
			t.Fatalf("document %d: B routed to %s, A had sent it to %s", i, got, where[i])
		}
	}
	var m strings.Builder
	b.srv.WriteMetrics(&m)
	if !strings.Contains(m.String(), `outcome="affinity"} 40`) {
		t.Fatalf("B's 40 decisions were not all prefix hits:\n%s", m.String())
	}
	if metric(a, `turnout_cluster_decisions_total{result="published"}`) != "40" {
		t.Fatalf("A published %s decisions, want 40", metric(a, `turnout_cluster_decisions_total{result="published"}`))
	}
}

// A prompt shorter than one block is still a decision peers count: the
// bounded-load guard evens out what every front sent (without it, two
// fronts in the sim placed Mooncake's requests unlike one front from the
// 9th request on; BENCHMARKS.md, "N fronts in the sim").
func TestSyncSharesShortPrompts(t *testing.T) {
	ns := natstest.Start(t, 0)
	a, b := startNode(t, ns.URL, "node-a"), startNode(t, ns.URL, "node-b")
	eventually(t, "both connected", func() bool { return a.sync.Connected() && b.sync.Connected() })
	time.Sleep(50 * time.Millisecond) // subscriptions reach the server
	// Under block_bytes 64: no block to share, a decision all the same.
	short := `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`
	for i := 1; i <= 5; i++ {
		decide(t, a, routeCtx(short, ""))
		eventually(t, fmt.Sprintf("B counts A's short decision %d", i), func() bool { return applied(b) == uint64(i) })
	}
	if got := metric(a, `turnout_cluster_decisions_total{result="published"}`); got != "5" {
		t.Fatalf("A published %s decisions, want 5", got)
	}
	if got := b.sync.recv[recvMalformed].Load(); got != 0 {
		t.Fatalf("B refused %d messages as malformed", got)
	}
}

// Malformed, oversized and foreign messages are dropped and counted; the
// subscriber keeps applying good ones.
func TestSyncBadMessages(t *testing.T) {
	dir := t.TempDir()
	port := natstest.FreePort(t)
	conf := filepath.Join(dir, "nats.conf")
	// Peers could raise max_payload: the receiver must still refuse.
	if err := os.WriteFile(conf, []byte("max_payload: 4194304\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t, port, "-c", conf)
	var logs lockedBuf
	lg := zerolog.New(&logs).Level(zerolog.WarnLevel)
	b := startNodeLog(t, ns.URL, "node-b", &lg)
	eventually(t, "connected", b.sync.Connected)
	time.Sleep(50 * time.Millisecond)
	raw, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	subj := b.sync.Subject("llama_mixed")
	good := appendRecord(appendHeader(nil, "node-x", "llama_mixed", 64), "c", []uint64{1, 2, 3})
	for _, m := range [][]byte{
		[]byte("garbage"),
		good[:len(good)-3], // truncated
		append(appendHeader(nil, "node-x", "llama_mixed", 64), 1, 'c', 0xff, 0xff, 0xff, 0xff, 0x0f), // huge block count
		append([]byte("TPX1"), 0),                                                       // empty origin
		bytes.Repeat([]byte("x"), MaxMessageBytes+1),                                    // oversized
		appendRecord(appendHeader(nil, "node-x", "other_pool", 64), "c", []uint64{1}),   // foreign pool
		appendRecord(appendHeader(nil, "node-x", "llama_mixed", 64), "zz", []uint64{1}), // unknown endpoint
		appendRecord(appendHeader(nil, "node-x", "llama_mixed", 128), "c", []uint64{1}), // other block size
		appendRecord(appendHeader(nil, "node-b", "llama_mixed", 64), "c", []uint64{1}),  // its own name
		loadMsg("node-b", "llama_mixed"),                                                // its own load message
		loadMsg("node-x", "other_pool"),                                                 // a load message for a foreign pool
		good,
	} {
		if err := raw.Publish(subj, m); err != nil {
			t.Fatal(err)
		}
	}
	_ = raw.Flush()
	eventually(t, "good message applied", func() bool { return applied(b) == 1 })
	for k, want := range map[int]uint64{recvMalformed: 3 + 1, recvOversized: 1, recvUnknownPool: 2, recvUnknownEndpoint: 1, recvBlockSize: 1, recvOwn: 2} {
		if got := b.sync.recv[k].Load(); got != want {
			t.Errorf("%s = %d, want %d", recvNames[k], got, want)
		}
	}
	// Logged once per kind, not once per message (4 malformed ones).
	for _, k := range []int{recvMalformed, recvOversized, recvBlockSize} {
		if n := strings.Count(logs.String(), `"reason":"`+recvNames[k]+`"`); n != 1 {
			t.Errorf("%s logged %d times at warn, want once:\n%s", recvNames[k], n, logs.String())
		}
	}
}

// loadMsg is a load message from origin for pool: endpoint c at level 1.
func loadMsg(origin, pool string) []byte {
	b := appendHeader(nil, origin, pool, 64)
	copy(b, loadMagic)
	return binary.AppendUvarint(append(b, 1, 'c'), 1)
}

// lockedBuf is a log sink shared with NATS callback goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// NATS down from the start, then up, then killed and restarted: decisions
// never wait, drops are counted while it is down, sync resumes after.
func TestSyncNATSOutage(t *testing.T) {
	port := natstest.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	a, b := startNode(t, url, "node-a"), startNode(t, url, "node-b")
	burst := func(from, n int) {
		for i := from; i < from+n; i++ {
			start := time.Now()
			decide(t, a, routeCtx(prompt(i), ""))
			if d := time.Since(start); d > 100*time.Millisecond {
				t.Fatalf("decision took %s with NATS down", d)
			}
		}
	}
	burst(0, 20)
	eventually(t, "drops counted", func() bool {
		return metric(a, `turnout_cluster_decisions_total{result="dropped_disconnected"}`) == "20"
	})

	ns := natstest.Start(t, port)
	eventually(t, "connected", func() bool { return a.sync.Connected() && b.sync.Connected() })
	time.Sleep(100 * time.Millisecond)
	burst(100, 10)
	eventually(t, "sync", func() bool { return applied(b) >= 10 })

	ns.Stop()
	eventually(t, "disconnect seen", func() bool { return !a.sync.Connected() })
	burst(200, 10)
	natstest.Start(t, port)
	eventually(t, "reconnected", func() bool { return a.sync.Connected() && b.sync.Connected() })
	before := applied(b)
	time.Sleep(100 * time.Millisecond)
	burst(300, 10)
	eventually(t, "sync resumes", func() bool { return applied(b) >= before+10 })
	if metric(a, "turnout_cluster_disconnects_total") != "1" || metric(a, "turnout_cluster_reconnects_total") != "1" {
		t.Fatalf("disconnects %s reconnects %s, want 1 and 1", metric(a, "turnout_cluster_disconnects_total"), metric(a, "turnout_cluster_reconnects_total"))
	}
	if gap := metric(a, "turnout_cluster_disconnected_seconds_total"); gap == "" || gap == "0" {
		t.Fatalf("gap not shown: %q", gap)
	}
}

// The decision path with the sink installed stays allocation-free.
func TestSyncDecisionAllocs(t *testing.T) {
	ns := natstest.Start(t, 0)
	a := startNode(t, ns.URL, "node-a")
	eventually(t, "connected", a.sync.Connected)
	ctx := routeCtx(prompt(1), "user-1")
	// Warm every queue item once: an item's block buffer grows on first use.
	for i := 0; i < a.sync.cfg.Queue+100; i++ {
		decide(t, a, ctx)
	}
	run := func() {
		ctx.Response.Reset()
		a.api.Handler(ctx)
		id, _ := strconv.ParseUint(b2s(ctx.Response.Header.Peek(contract.HdrDecision)), 16, 64)
		a.srv.Ledger().Complete(id)
	}
	if n := testing.AllocsPerRun(500, run); n != 0 {
		t.Fatalf("%v allocations per decision with cluster sync on", n)
	}
}

// A full queue drops (counted) instead of waiting.
func TestSyncQueueFullDrops(t *testing.T) {
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(fourEndpoints, "nats://127.0.0.1:1", "n")))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cluster.Queue = 16
	srv, err := route.New(cfg, route.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s, err := New(srv, cfg.Cluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.nc.Close()
	// Run is not started: nothing drains the queue.
	n := &node{srv: srv, api: httpapi.New(srv), sync: s}
	for i := 0; i < 40; i++ {
		decide(t, n, routeCtx(prompt(i), ""))
	}
	if got := s.dropFull.Load(); got != 24 {
		t.Fatalf("dropped %d, want 24", got)
	}
}

// b2s views bytes as a string without copying (test helper).
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Issue 27: an idle publisher sleeps (it polled every batch_delay before:
// 1.1 CPU-s a minute) and the next decision wakes it and reaches the peer.
func TestSyncIdlePublisherParks(t *testing.T) {
	ns := natstest.Start(t, 0)
	a, b := startNode(t, ns.URL, "node-a"), startNode(t, ns.URL, "node-b")
	eventually(t, "both connected", func() bool { return a.sync.Connected() && b.sync.Connected() })
	time.Sleep(50 * time.Millisecond) // subscriptions reach the server
	for round := 1; round <= 3; round++ {
		eventually(t, "A's publisher parked", func() bool { return idle(a) })
		before := a.sync.ticks.Load()
		time.Sleep(100 * time.Millisecond) // 50 ticks of batch_delay 2ms when polling
		if woke := a.sync.ticks.Load() - before; woke != 0 {
			t.Fatalf("round %d: idle publisher woke %d times in 100 ms", round, woke)
		}
		decide(t, a, routeCtx(prompt(round), ""))
		eventually(t, "B applies A's decision", func() bool { return applied(b) >= uint64(round) })
	}
}

// Issue 27: a front's in-flight counts reach its peers with its decisions,
// as levels: B's peer load on each endpoint is what A holds open there.
func TestSyncSharesLoads(t *testing.T) {
	ns := natstest.Start(t, 0)
	a, b := startNode(t, ns.URL, "node-a"), startNode(t, ns.URL, "node-b")
	eventually(t, "both connected", func() bool { return a.sync.Connected() && b.sync.Connected() })
	time.Sleep(50 * time.Millisecond) // subscriptions reach the server
	var ids []uint64
	for i := range 6 {
		ctx := routeCtx(prompt(100+i), "")
		a.api.Handler(ctx)
		var id uint64
		fmt.Sscanf(string(ctx.Response.Header.Peek(contract.HdrDecision)), "%x", &id)
		ids = append(ids, id)
	}
	aEps := a.srv.Snapshot().Deployments[0].Serve.Endpoints
	bEps := b.srv.Snapshot().Deployments[0].Serve.Endpoints
	same := func() bool {
		for i := range aEps {
			if bEps[i].PeerMark() != aEps[i].Inflight() {
				return false
			}
		}
		return true
	}
	eventually(t, "B sees A's 6 open decisions", func() bool {
		return same() && bEps[0].PeerMark()+bEps[1].PeerMark()+bEps[2].PeerMark()+bEps[3].PeerMark() == 6
	})
	// Completions reach B without a next decision (levelDelay), one by
	// one: a level left stale across an engine scrape would turn into an
	// underestimate after it.
	for k, id := range ids {
		a.srv.Ledger().Complete(id)
		eventually(t, fmt.Sprintf("B sees %d of A's decisions closed", k+1), func() bool {
			return same() && bEps[0].PeerMark()+bEps[1].PeerMark()+bEps[2].PeerMark()+bEps[3].PeerMark() == int64(5-k)
		})
	}
	// With nothing open, the publisher parks for good again.
	eventually(t, "A's publisher parked", func() bool { return idle(a) })
	before := a.sync.ticks.Load()
	time.Sleep(100 * time.Millisecond) // 5 level wake-ups were it still open
	if woke := a.sync.ticks.Load() - before; woke != 0 {
		t.Fatalf("publisher woke %d times in 100 ms with no request open", woke)
	}
	if metric(b, `turnout_cluster_load_messages_total{direction="in"}`) == "0" {
		t.Fatal("no load message counted in")
	}
	// A malformed load message is refused whole.
	bad, _ := appendLoads(nil, "node-c", a.srv.Snapshot().Deployments[0].Serve)
	if _, err := validateLoads(bad[:len(bad)-1]); err == nil {
		t.Fatal("truncated load message accepted")
	}
}
