package route

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
	"github.com/turnout/turnout/route/policy"
)

func kvServer(t *testing.T, params string) (*Decider, *policy.KVAware) {
	t.Helper()
	s := mustServer(t, fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: kv-aware, params: {%s}}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
          - {name: c, address: 127.0.0.1:8003}
`, params))
	t.Cleanup(s.Close)
	return s, s.Snapshot().Deployments[0].Serve.Policy.(*policy.KVAware)
}

func seqToks(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func tokBody(toks []uint32) string {
	var b strings.Builder
	b.WriteString(`{"model":"llama","prompt":[`)
	for i, t := range toks {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, t)
	}
	b.WriteString(`]}`)
	return b.String()
}

// store tells the index that src holds toks (engine hashes 1000+i).
func store(ix *kv.Index, src string, toks []uint32, bs int) []uint64 {
	var hashes []uint64
	for i := 0; i < len(toks)/bs; i++ {
		hashes = append(hashes, uint64(1000+i))
	}
	ix.Apply(src, kv.Batch{Events: []kv.Event{{Kind: kv.EventBlockStored, BlockHashes: hashes, TokenIDs: toks[:len(hashes)*bs], BlockSize: bs}}})
	return hashes
}

func TestKVAwareRouting(t *testing.T) {
	s, k := kvServer(t, "block_size: 4, tokenizer: {mode: none}")
	toks := seqToks(64, 100)
	hashes := store(k.Index(), "b", toks, 4)
	for i := 0; i < 10; i++ {
		ctx := do(s, tokBody(toks))
		if hdr(ctx, contract.HdrServer) != "b" {
			t.Fatalf("request %d went to %s, b holds the blocks", i, hdr(ctx, contract.HdrServer))
		}
		id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
		s.Ledger().Complete(id)
	}
	// b evicts the blocks: the request no longer sticks to b.
	k.Index().Apply("b", kv.Batch{Events: []kv.Event{{Kind: kv.EventBlockRemoved, BlockHashes: hashes}}})
	seen := map[string]bool{}
	for i := 0; i < 30; i++ {
		ctx := do(s, tokBody(seqToks(64, uint32(5000+i*100))))
		seen[hdr(ctx, contract.HdrServer)] = true
		id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
		s.Ledger().Complete(id)
	}
	if len(seen) < 2 {
		t.Fatalf("without cached blocks requests should spread: %v", seen)
	}
	// Load guard: b holds the blocks but is far too loaded.
	store(k.Index(), "b", toks, 4)
	s.Snapshot().Deployments[0].Serve.Endpoints[1].AddInflight(50)
	if got := hdr(do(s, tokBody(toks)), contract.HdrServer); got == "b" {
		t.Fatal("routed to an overloaded replica")
	}
}

func TestKVAwareStrictAndLenient(t *testing.T) {
	chat := chatBody("llama", "sys", "hello")
	s, k := kvServer(t, "block_size: 4, strict: true, tokenizer: {mode: none}")
	if ctx := do(s, chat); ctx.Response.StatusCode() != 400 || routetest.ErrBody(t, ctx.Response.Body()).Code != "token_ids_required" {
		t.Fatalf("strict without token ids: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	s2, k2 := kvServer(t, "block_size: 4, strict: true, tokenizer: {mode: remote, address: '127.0.0.1:1', timeout: 100ms}")
	if ctx := do(s2, chat); ctx.Response.StatusCode() != 503 || routetest.ErrBody(t, ctx.Response.Body()).Code != "tokenizer_unavailable" {
		t.Fatalf("strict with tokenizer down: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	_ = k2
	s3, k3 := kvServer(t, "block_size: 4, tokenizer: {mode: remote, address: '127.0.0.1:1', timeout: 100ms}")
	if ctx := do(s3, chat); ctx.Response.StatusCode() != 200 || k3.Fallbacks() != 1 {
		t.Fatalf("lenient: %d fallbacks %d", ctx.Response.StatusCode(), k3.Fallbacks())
	}
	_ = k
}

// A fake vLLM /tokenize: one token per word, counted calls.
func fakeTokenizer(t *testing.T) (string, *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		calls.Add(1)
		if string(ctx.Path()) != "/tokenize" || !strings.Contains(string(ctx.PostBody()), `"model":"llama"`) {
			ctx.SetStatusCode(400)
			return
		}
		words := strings.Fields(string(ctx.PostBody()))
		var b strings.Builder
		b.WriteString(`{"count":1,"max_model_len":8192,"tokens":[`)
		for i := range words {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, 100+i)
		}
		b.WriteString(`],"token_strs":null}`)
		ctx.SetBodyString(b.String())
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String(), &calls
}

func TestKVAwareRemoteTokenizer(t *testing.T) {
	addr, calls := fakeTokenizer(t)
	s, k := kvServer(t, "block_size: 4, tokenizer: {mode: remote, address: '"+addr+"'}")
	body := chatBody("llama", strings.Repeat("w ", 40), "q")
	toks := seqToks(len(strings.Fields(`{"model":"llama","messages":`+topValueString(body, "messages")+`}`)), 100)
	store(k.Index(), "c", toks, 4)
	for i := 0; i < 5; i++ {
		if got := hdr(do(s, body), contract.HdrServer); got != "c" {
			t.Fatalf("went to %s, c holds the tokenized prompt", got)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("tokenizer called %d times; the cache should answer repeats", calls.Load())
	}
}

func topValueString(body, key string) string { return string(payload.TopValue([]byte(body), key)) }

func TestKVAwareTokenPromptAllocs(t *testing.T) {
	s, k := kvServer(t, "block_size: 16, tokenizer: {mode: none}")
	toks := seqToks(1024, 7)
	store(k.Index(), "a", toks, 16)
	ctx := routeCtx(tokBody(toks), "")
	assertZeroAllocs(t, s, ctx)
	if hdr(ctx, contract.HdrServer) != "a" {
		t.Fatalf("routed to %s", hdr(ctx, contract.HdrServer))
	}
}

// Reloads keep the index and subscriptions.
func TestKVAwareCarry(t *testing.T) {
	s, k := kvServer(t, "block_size: 4, tokenizer: {mode: none}")
	toks := seqToks(32, 1)
	store(k.Index(), "a", toks, 4)
	cfg := *s.Snapshot().Config
	if err := s.Apply(&cfg); err != nil {
		t.Fatal(err)
	}
	k2 := s.Snapshot().Deployments[0].Serve.Policy.(*policy.KVAware)
	if k2 == k || k2.Index() != k.Index() {
		t.Fatal("index not carried over")
	}
	if got := hdr(do(s, tokBody(toks)), contract.HdrServer); got != "a" {
		t.Fatalf("after reload went to %s", got)
	}
}

// A tokenizer cache hit keeps the decision allocation-free; only misses pay
// for the /tokenize call.
func TestKVAwareTokenizerHitAllocs(t *testing.T) {
	addr, calls := fakeTokenizer(t)
	s, _ := kvServer(t, "block_size: 4, tokenizer: {mode: remote, address: '"+addr+"'}")
	assertZeroAllocs(t, s, routeCtx(chatBody("llama", strings.Repeat("w ", 200), "q"), ""))
	if calls.Load() != 1 {
		t.Fatalf("tokenizer called %d times", calls.Load())
	}
}

// BenchmarkRouteKVAware: a 1024-token prompt given as token ids, 3
// endpoints, one holding it (the tokenizer-free path).
func BenchmarkRouteKVAware(b *testing.B) {
	s := mustServer(b, `
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: kv-aware, params: {block_size: 16, tokenizer: {mode: none}}}
    pools: [{role: mixed, endpoints: [{name: a, address: 127.0.0.1:8001}, {name: b, address: 127.0.0.1:8002}, {name: c, address: 127.0.0.1:8003}]}]
`)
	defer s.Close()
	toks := seqToks(1024, 7)
	store(s.Snapshot().Deployments[0].Serve.Policy.(*policy.KVAware).Index(), "b", toks, 16)
	ctx := routeCtx(tokBody(toks), "")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx.Response.Reset()
		handle(s, ctx)
		id, _ := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		s.Ledger().Complete(id)
	}
}

// A replica whose event stream had a gap counts half of what the index says
// it holds: with equal holdings, the replica with a clean stream wins.
func TestKVAwareStaleDiscount(t *testing.T) {
	s, k := kvServer(t, "block_size: 4, tokenizer: {mode: none}")
	toks := seqToks(64, 3)
	store(k.Index(), "a", toks, 4)
	store(k.Index(), "b", toks, 4)
	k.Index().MarkStale("a")
	for i := 0; i < 20; i++ {
		ctx := do(s, tokBody(toks))
		if got := hdr(ctx, contract.HdrServer); got != "b" {
			t.Fatalf("request %d went to %s; a is stale", i, got)
		}
		id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
		s.Ledger().Complete(id)
	}
}

// Each lenient fallback is counted under its reason, and a block size the
// engine reported (vLLM's cache_config_info, scraped with the load) keys
// requests before any KV event arrived.
func TestKVAwareFallbackReasons(t *testing.T) {
	s, k := kvServer(t, "tokenizer: {mode: none}")
	toks := seqToks(64, 100)
	do(s, tokBody(toks))
	if got := k.FallbacksFor(policy.KVFallbackBlockSize); got != 1 {
		t.Fatalf("cold start without a block size: %d block_size_unknown fallbacks, want 1", got)
	}
	eps := s.Snapshot().Deployments[0].Serve.Endpoints
	eps[2].SetEngineLoad(&fleet.EngineLoad{KVUsage: -1, BlockSize: 4})
	store(k.Index(), "b", toks, 4)
	if got := hdr(do(s, tokBody(toks)), contract.HdrServer); got != "b" || k.Fallbacks() != 1 || k.Index().BlockSize() != 4 {
		t.Fatalf("with the engine's block size: routed to %q (b holds the blocks), fallbacks %d, block size %d", got, k.Fallbacks(), k.Index().BlockSize())
	}
	do(s, tokBody(seqToks(3, 7)))
	do(s, chatBody("llama", "sys", "hello"))
	for r, want := range map[policy.KVFallback]uint64{policy.KVFallbackBlockSize: 1, policy.KVFallbackShort: 1, policy.KVFallbackNoTokens: 1, policy.KVFallbackTokenizer: 0} {
		if got := k.FallbacksFor(r); got != want {
			t.Errorf("%s fallbacks %d, want %d", r, got, want)
		}
	}
	s2, k2 := kvServer(t, "block_size: 4, tokenizer: {mode: remote, address: '127.0.0.1:1', timeout: 100ms}")
	do(s2, chatBody("llama", "sys", "hello"))
	if k2.FallbacksFor(policy.KVFallbackTokenizer) != 1 {
		t.Errorf("tokenizer down: %d tokenizer_error fallbacks, want 1", k2.FallbacksFor(policy.KVFallbackTokenizer))
	}
	var m strings.Builder
	k.WriteMetrics(s.Snapshot().Deployments[0].Serve, &m)
	for _, want := range []string{`reason="block_size_unknown"} 1`, `reason="short_prompt"} 1`, `turnout_kv_index_skipped_total{deployment="llama",pool="llama_mixed",reason="orphan"} 0`, `turnout_kv_index_block_size_tokens{deployment="llama",pool="llama_mixed"} 4`} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, m.String())
		}
	}
}

// An adapter request never matches the index's base-model blocks (the
// engine keys an adapter's blocks by it, and route/kv skips LoRA events):
// kv-aware routes it by its prefix fallback, keyed by adapter, even in
// strict mode, and counts it as an adapter fallback.
func TestKVAwareAdapterFallback(t *testing.T) {
	for _, strict := range []bool{false, true} {
		s, k := kvServer(t, fmt.Sprintf("block_size: 4, strict: %v, tokenizer: {mode: none}", strict))
		for _, name := range []string{"a", "b", "c"} {
			setServed(s, name, base("llama"), lora("sql"))
		}
		toks := seqToks(64, 100)
		store(k.Index(), "b", toks, 4)
		if got := hdr(do(s, tokBody(toks)), contract.HdrServer); got != "b" {
			t.Fatalf("strict %v: base-model request routed to %q, b holds its blocks", strict, got)
		}
		adapterBody := strings.Replace(tokBody(toks), `"model":"llama"`, `"model":"sql"`, 1)
		first := do(s, adapterBody)
		if first.Response.StatusCode() != 200 {
			t.Fatalf("strict %v: adapter request answered %d %s", strict, first.Response.StatusCode(), first.Response.Body())
		}
		if got := k.FallbacksFor(policy.KVFallbackAdapter); got != 1 {
			t.Fatalf("strict %v: %d adapter fallbacks, want 1", strict, got)
		}
		// The fallback recorded the adapter's prompt: its next turn follows.
		again := hdr(do(s, adapterBody), contract.HdrServer)
		if want := hdr(first, contract.HdrServer); again != want {
			t.Errorf("strict %v: the adapter's second request went to %q, its first to %q", strict, again, want)
		}
	}
}
