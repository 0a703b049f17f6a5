package cluster

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route"
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
		ns := startNATS(b, 0)
		n = startNode(b, ns.URL, "bench-a")
		eventually(b, "connected", n.sync.Connected)
	} else {
		cfg, err := config.ParseConfig([]byte(strings.Replace(fmt.Sprintf(fourEndpoints, "", "x"), "cluster: {nats: \"\", name: x, batch_delay: 2ms}\n", "", 1)))
		if err != nil {
			b.Fatal(err)
		}
		srv, err := route.NewServer(cfg, route.Options{Seed: 42})
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
	b.ReportAllocs()
	b.SetBytes(int64(len(ctxs[0].Request.Body())))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx := ctxs[i%len(ctxs)]
		ctx.Response.Reset()
		n.srv.Handler(ctx)
		id, _ := strconv.ParseUint(b2s(ctx.Response.Header.Peek(route.HdrDecision)), 16, 64)
		n.srv.Complete(id)
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

// BenchmarkPrefixHandoff is the decision path's own share of sync: handing
// one decision (55 blocks) to the queue. The loop also takes the item back
// as the publisher would (two more channel operations), so the figure is an
// upper bound of what a decision pays.
func BenchmarkPrefixHandoff(b *testing.B) {
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(fourEndpoints, "nats://127.0.0.1:1", "bench-h")))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := route.NewServer(cfg, route.Options{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	s, err := New(srv, cfg.Cluster, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.nc.Close()
	p := srv.Snapshot().Deployments[0].Serve
	blocks := make([]uint64, 55)
	for i := range blocks {
		blocks[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.RoutedPrefix(p, p.Endpoints[i&3], blocks)
		s.free <- <-s.queue
	}
	b.StopTimer()
	if s.dropFull.Load() != 0 {
		b.Fatalf("%d dropped", s.dropFull.Load())
	}
}
