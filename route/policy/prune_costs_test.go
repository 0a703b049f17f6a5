package policy

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
)

// newKVAwareRig is kv-aware over a pool of n endpoints (max_candidates at
// its default), started, with no KV events and no block size.
func newKVAwareRig(t *testing.T, n int) (*KVAware, *pruneRig) {
	t.Helper()
	r := newPruneRig(t, KVAwareType, n, 0)
	k := r.pol.(*KVAware)
	// Chat bodies without token ids: the prefix fallback hashes them.
	for i := range r.reqs {
		var idx payload.Index
		idx.Build(fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":"prompt %d"}]}`, i%16), false)
		r.reqs[i].Payload = &idx
	}
	k.Start(r.pool)
	t.Cleanup(k.Close)
	return k, r
}

// TestKVAwareBlockSizeProbes: while no block size is known, a decision
// in a pool of at most max_candidates endpoints looks at every engine's
// report (the next decision keys with it, as without pruning), one in a
// larger pool at max_candidates of them, from where the last stopped: a
// report is taken within pool/max_candidates decisions, and a decision
// allocates nothing.
func TestKVAwareBlockSizeProbes(t *testing.T) {
	k, r := newKVAwareRig(t, 64)
	if k.probes != 0 {
		t.Fatalf("64 endpoints: %d probes per decision, want all", k.probes)
	}
	r.run(t, 0, 3, make([]*fleet.Endpoint, 8))
	r.pool.Endpoints[63].SetEngineLoad(&fleet.EngineLoad{KVUsage: -1, BlockSize: 16})
	r.run(t, 3, 1, make([]*fleet.Endpoint, 8))
	if got := k.Index().BlockSize(); got != 16 {
		t.Fatalf("64 endpoints: block size %d after the decision that followed the report, want 16", got)
	}

	k, r = newKVAwareRig(t, 1024)
	if k.probes != 64 {
		t.Fatalf("1,024 endpoints: %d probes per decision, want 64 (max_candidates)", k.probes)
	}
	open := make([]*fleet.Endpoint, 2048)
	r.run(t, 0, len(r.reqs), open) // every payload parsed once
	dst := make([]*fleet.Endpoint, 0, 3)
	c := &fleet.Choice{}
	i := 0
	if allocs := testing.AllocsPerRun(500, func() {
		*c = fleet.Choice{Endpoints: dst}
		r.pol.Pick(&r.reqs[i%len(r.reqs)], r.pool, c)
		i++
	}); allocs != 0 {
		t.Fatalf("1,024 endpoints without a block size: %v allocations per decision", allocs)
	}
	r.pool.Endpoints[777].SetEngineLoad(&fleet.EngineLoad{KVUsage: -1, BlockSize: 32})
	before := k.FallbacksFor(KVFallbackBlockSize)
	for d := 1; k.Index().BlockSize() == 0; d++ {
		if d > 1024/64 {
			t.Fatalf("1,024 endpoints: block size not learned in %d decisions", d-1)
		}
		r.run(t, d, 1, open)
	}
	if got := k.Index().BlockSize(); got != 32 {
		t.Fatalf("block size %d, want 32", got)
	}
	if k.FallbacksFor(KVFallbackBlockSize) == before {
		t.Fatal("no decision fell back for want of a block size while it was unknown")
	}
}

// TestTTFTGuardPruned: at 1,024 endpoints the guard still predicts the
// candidate set when the margins can be cleared: prefix-affinity's pick
// holds the prompt behind a queue that costs more than its prefill, and
// the guard moves the request to an idle candidate, without allocating.
func TestTTFTGuardPruned(t *testing.T) {
	cfg := DefaultPredictedTTFTConfig()
	cfg.BlockBytes, cfg.SessionAffinity, cfg.PerRequestMs = 64, false, 200
	var pt *PredictedTTFT
	p := routetest.Pool(t, 1024, func(p *fleet.Pool) fleet.Policy {
		pt = NewPredictedTTFT(cfg, p, fleet.NewRand(5))
		applyPruning(pt, &fleet.PolicyEnv{Pool: p, Rand: fleet.NewRand(5)}, config.DefaultMaxCandidates)
		return pt
	})
	if pt.prune == nil {
		t.Fatal("no candidate index at 1,024 endpoints")
	}
	sys := string(make([]byte, 64*20))
	holder := p.Endpoints[600]
	pt.idx.lrus[holder.Index].insert(blocksOf(sys, 1))
	holder.AddInflight(4) // within prefix-affinity's balance_abs: it proposes the hit
	blocks := blocksOf(sys, 2)
	req := &fleet.Request{Blocks: blocks, PromptBytes: len(blocks) * 64}
	c := routetest.Choose(p, req, 3)
	if c.Endpoints[0] == holder || c.Endpoints[0].Load() != 0 || pt.Overrides() != 1 || !hasName(c.Endpoints, holder.Name) {
		t.Fatalf("pick %s (load %d), overrides %d: want an idle endpoint first, %s a fallback", routetest.Names(c.Endpoints), c.Endpoints[0].Load(), pt.Overrides(), holder.Name)
	}
	dst := make([]*fleet.Endpoint, 0, 3)
	if allocs := testing.AllocsPerRun(500, func() {
		*c = fleet.Choice{Endpoints: dst}
		p.Policy.Pick(req, p, c)
	}); allocs != 0 {
		t.Fatalf("%v allocations per decision", allocs)
	}
}

// kvEventsRig is kv-aware over n endpoints with token-id prompts of 32
// blocks of 16 tokens, the first 24 shared by one of 16 heads, each head's
// blocks stored (KV events) on 4 endpoints.
func kvEventsRig(tb testing.TB, n int) *pruneRig {
	tb.Helper()
	r := newPruneRig(tb, KVAwareType, n, 0)
	k := r.pol.(*KVAware)
	k.Start(r.pool)
	tb.Cleanup(k.Close)
	k.Index().SetBlockSize(16)
	for i := range r.reqs {
		toks := make([]uint32, 32*16)
		for j := range toks {
			toks[j] = uint32(i%16*100000 + j)
			if j >= 24*16 {
				toks[j] = uint32(1e7 + i*1000 + j)
			}
		}
		var body []byte
		body = append(body, `{"model":"m","prompt":[`...)
		for j, t := range toks {
			if j > 0 {
				body = append(body, ',')
			}
			body = fmt.Append(body, t)
		}
		body = append(body, "]}"...)
		var idx payload.Index
		idx.Build(body, false)
		r.reqs[i].Payload = &idx
		if i < 16 {
			keys := kv.BlockKeys(toks[:24*16], 16, nil)
			for h := range 4 {
				e := r.pool.Endpoints[(i*131+h*37)%n]
				k.Index().Apply(e.Name, kv.Batch{Events: []kv.Event{{Kind: kv.EventBlockStored, BlockHashes: keys, TokenIDs: toks[:len(keys)*16], BlockSize: 16}}})
			}
		}
	}
	return r
}

// BenchmarkKVAwareEvents is one kv-aware decision on token ids whose
// blocks KV events placed, at 64 and 1,024 endpoints.
func BenchmarkKVAwareEvents(b *testing.B) {
	for _, n := range []int{64, 1024} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := kvEventsRig(b, n)
			r.bench(b, 2*n+len(r.reqs))
		})
	}
}
