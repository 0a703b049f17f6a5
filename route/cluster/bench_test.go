package cluster

import (
	"github.com/turnout/turnout/route/httpapi"

	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/lab/testenv/natstest"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// body4K is the route package's benchmark body: ~4 KiB chat, shared system
// prompt, distinct question.
func body4K(i int) string {
	sys := strings.Repeat("You are a helpful assistant that answers precisely. ", 80)
	return fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":"What is the capital of country number %d?"}],"stream":true}`, sys[:3500], i)
}

// benchDecisions routes 64 distinct 4 KiB bodies with prefix-affinity
// (block_bytes 64 as in fourEndpoints: ~55 blocks per prompt), with or
// without a connected cluster sync, and reports NATS payload bytes per
// decision.
func benchDecisions(b *testing.B, sync bool) {
	var n *node
	if sync {
		ns := natstest.Start(b, 0)
		n = startNode(b, ns.URL, "bench-a")
		eventually(b, "connected", n.sync.Connected)
	} else {
		cfg, err := config.ParseConfig([]byte(strings.Replace(fmt.Sprintf(fourEndpoints, "", "x"), "cluster: {nats: \"\", name: x, batch_delay: 2ms}\n", "", 1)))
		if err != nil {
			b.Fatal(err)
		}
		srv, err := route.New(cfg, route.Options{Seed: 42})
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Close()
		n = &node{srv: srv}
	}
	ctxs := make([]*fasthttp.RequestCtx, 64)
	for i := range ctxs {
		ctxs[i] = routeCtx(body4K(i), "user-"+strconv.Itoa(i%97))
	}
	api := httpapi.New(n.srv)
	b.ReportAllocs()
	b.SetBytes(int64(len(ctxs[0].Request.Body())))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx := ctxs[i%len(ctxs)]
		ctx.Response.Reset()
		api.Handler(ctx)
		id, _ := strconv.ParseUint(b2s(ctx.Response.Header.Peek(contract.HdrDecision)), 16, 64)
		n.srv.Ledger().Complete(id)
	}
	b.StopTimer()
	if sync {
		n.stop() // flushes the last batch
		pub := n.sync.publishedDec.Load()
		if pub > 0 {
			b.ReportMetric(float64(n.sync.publishedBytes.Load())/float64(pub), "natsB/decision")
			b.ReportMetric(float64(pub)/float64(n.sync.publishedMsgs.Load()), "decisions/msg")
		}
		b.ReportMetric(float64(n.sync.dropFull.Load()), "dropped")
	}
}

func BenchmarkDecisionSyncOff(b *testing.B) { benchDecisions(b, false) }
func BenchmarkDecisionSyncOn(b *testing.B)  { benchDecisions(b, true) }

// handoffSync is a Sync whose NATS server is unreachable (nothing is
// published), for the handoff benchmarks.
func handoffSync(b *testing.B) (*Sync, *fleet.Pool, []uint64) {
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(fourEndpoints, "nats://127.0.0.1:1", "bench-h")))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := route.New(cfg, route.Options{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	s, err := New(srv, cfg.Cluster, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.nc.Close)
	blocks := make([]uint64, 55)
	for i := range blocks {
		blocks[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	return s, srv.Snapshot().Deployments[0].Serve, blocks
}

// BenchmarkPrefixHandoff is the decision path's own share of sync: handing
// one decision (55 blocks) to the ring. The loop also takes the slot back
// as the publisher would (a load and a store on the slot), so the figure is
// an upper bound of what a decision pays.
func BenchmarkPrefixHandoff(b *testing.B) {
	s, p, blocks := handoffSync(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.RoutedPrefix(p, p.Endpoints[i&3], blocks)
		s.ring.release(s.ring.peek())
	}
	b.StopTimer()
	if s.dropFull.Load() != 0 {
		b.Fatalf("%d dropped", s.dropFull.Load())
	}
}

// BenchmarkPrefixHandoffParallel hands decisions over from every P at
// once while a consumer drains the ring without pause (the publisher drains
// on a tick; draining always is the worst case for sharing): the producers contend on the ring's cursor and the consumer reads
// and releases their slots meanwhile (the cache-line traffic a busy box
// sees). Each iteration first does about 0.5 µs of other work, standing in
// for the rest of a decision, and every 32nd yields, so the consumer keeps
// up as it would;
// "handoff=no" is that work alone, and the difference is what the handoff
// costs under contention.
func BenchmarkPrefixHandoffParallel(b *testing.B) {
	for _, handoff := range []bool{false, true} {
		b.Run(fmt.Sprintf("handoff=%v", map[bool]string{false: "no", true: "yes"}[handoff]), func(b *testing.B) {
			s, p, blocks := handoffSyncP(b)
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					for it := s.ring.peek(); it != nil; it = s.ring.peek() {
						s.ring.release(it)
					}
					runtime.Gosched()
				}
			}()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := uint64(0)
				bl := append([]uint64(nil), blocks...) // per goroutine: written below
				for pb.Next() {
					bl[0] = otherWork(i) // keeps the work from being optimised away
					if handoff {
						s.RoutedPrefix(p, p.Endpoints[i&3], bl)
					}
					i++
					if i%32 == 0 {
						// A real handler waits on the network between
						// decisions; without a pause the consumer would
						// wait for preemption (10 ms) and the ring fill.
						runtime.Gosched()
					}
				}
			})
			b.StopTimer()
			close(stop)
			<-done
			b.ReportMetric(float64(s.dropFull.Load())/float64(b.N), "dropped/op")
		})
	}
}

// otherWork is about 0.5 µs of arithmetic.
func otherWork(x uint64) uint64 {
	for i := 0; i < 400; i++ {
		x ^= x >> 31
		x *= 0x9e3779b97f4a7c15
	}
	return x
}

func handoffSyncP(b *testing.B) (*Sync, *fleet.Pool, []uint64) { return handoffSync(b) }
