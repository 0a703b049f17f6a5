package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/tokenize"
)

// KVAwareType is the registry name of KVAware.
const KVAwareType = "kv-aware"

// KVAwareConfig are the params of kv-aware.
//
// Scoring (Dynamo's cost, lower is better), over available endpoints that are
// not too loaded (same guard as prefix-affinity):
//
//	cost(e) = PrefillWeight * uncachedBlocks(e) + LoadWeight * inflight(e)
//
// where uncachedBlocks counts the request's blocks beyond the longest prefix
// e really holds according to its KV events. Ties go to the lower in-flight
// count; the fallback list is the next lowest costs.
type KVAwareConfig struct {
	// BlockSize is vLLM's --block-size in tokens (0: learn it from events).
	BlockSize     int     `yaml:"block_size"`
	MaxBlocks     int     `yaml:"max_blocks"`
	PrefillWeight float64 `yaml:"prefill_weight"`
	LoadWeight    float64 `yaml:"load_weight"`
	BalanceAbs    int64   `yaml:"balance_abs"`
	BalanceRel    float64 `yaml:"balance_rel"`
	// Strict refuses requests without token ids (400) or with the tokenizer
	// Down (503), as Ray's KV router does; lenient falls back to prefix-affinity.
	Strict    bool                 `yaml:"strict"`
	Tokenizer TokenizerConfig      `yaml:"tokenizer"`
	Fallback  PrefixAffinityConfig `yaml:"fallback"`
}

// TokenizerConfig configures how request text becomes token ids.
type TokenizerConfig struct {
	// Mode: "remote" calls vLLM's POST /tokenize; "none" uses only token-id prompts.
	Mode string `yaml:"mode"`
	// Address of a vLLM server for /tokenize ("" = the pool's own endpoints).
	Address      string          `yaml:"address"`
	Timeout      config.Duration `yaml:"timeout"`
	CacheEntries int             `yaml:"cache_entries"`
}

// Validate checks the params.
func (c *KVAwareConfig) Validate() error {
	switch {
	case c.BlockSize < 0 || c.BlockSize > 4096:
		return fmt.Errorf("kv-aware block_size %d out of range [0, 4096]", c.BlockSize)
	case c.MaxBlocks < 1024:
		return fmt.Errorf("kv-aware max_blocks %d must be >= 1024", c.MaxBlocks)
	case c.PrefillWeight < 0 || c.LoadWeight < 0:
		return errors.New("kv-aware weights must be >= 0")
	case c.BalanceRel < 1 || c.BalanceAbs < 0:
		return errors.New("kv-aware balance_rel must be >= 1 and balance_abs >= 0")
	case c.Tokenizer.Mode != "remote" && c.Tokenizer.Mode != "none":
		return fmt.Errorf("kv-aware tokenizer.mode %q must be remote or none", c.Tokenizer.Mode)
	case c.Tokenizer.Timeout.D() <= 0:
		return errors.New("kv-aware tokenizer.timeout must be > 0")
	case c.Tokenizer.CacheEntries < 0:
		return errors.New("kv-aware tokenizer.cache_entries must be >= 0")
	}
	return c.Fallback.Validate()
}

// KVAware routes on the blocks each replica really holds, learned from vLLM
// KV-cache events, and falls back to prefix-affinity when it has no tokens.
type KVAware struct {
	cfg      KVAwareConfig
	log      *zerolog.Logger
	ctx      context.Context
	hub      *kv.Hub
	pool     string
	eps      []kv.Endpoint
	fallback *PrefixAffinity
	tok      *tokenize.Client
	// profile ranks by KV cost once the request's blocks are matched.
	profile Profile

	// Shared with the policies of later snapshots (Carry).
	sh *kvShared

	ids []int   // index source id per endpoint index
	at  []int32 // endpoint index per index source id (-1: not in this pool)
	// probes is how many endpoints a decision looks at for an engine's
	// block size (0: all; learnBlockSize), probed where the next starts.
	probes int
	probed atomic.Uint64
	bufs   sync.Pool
	// counters
	fallbacks    [numKVFallbacks]atomic.Uint64
	tokenized    atomic.Uint64
	tokenizeErrs atomic.Uint64
	tokenIDs     atomic.Uint64
}

// kvShared is what survives reloads: the index, the subscriptions and the
// tokenizer cache.
type kvShared struct {
	idx     *kv.Index
	mgr     *kv.Manager
	adopted atomic.Bool
}

type kvBuf struct {
	cy     Cycle
	req    fleet.Request // the fallback's copy of the request
	keys   []uint64
	m      kv.Matches // zero between decisions
	blocks []uint64
	hasher fleet.PrefixHasher
}

// NewKVAwareFactory returns the factory for kv-aware.
func NewKVAwareFactory() Factory {
	return configured(DefaultKVAwareConfig, func(cfg KVAwareConfig, env fleet.PolicyEnv) fleet.Policy {
		return NewKVAware(cfg, env)
	})
}

// DefaultKVAwareConfig returns the defaults.
func DefaultKVAwareConfig() KVAwareConfig {
	return KVAwareConfig{
		MaxBlocks: 1 << 20, PrefillWeight: 1, LoadWeight: 1, BalanceAbs: 8, BalanceRel: 1.5,
		Tokenizer: TokenizerConfig{Mode: "remote", Timeout: config.Duration(200 * time.Millisecond), CacheEntries: 4096},
		Fallback:  DefaultPrefixAffinityConfig(),
	}
}

// NewKVAware builds the policy for env.Pool. Subscriptions start in Start.
func NewKVAware(cfg KVAwareConfig, env fleet.PolicyEnv) *KVAware {
	log := env.Log
	if log == nil {
		l := zerolog.Nop()
		log = &l
	}
	ctx := env.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	k := &KVAware{
		cfg: cfg, log: log, ctx: ctx, pool: env.Pool.Name,
		fallback: NewPrefixAffinity(cfg.Fallback, env.Pool, env.Rand),
	}
	// Preset: the KV-cost ranking over every slot (LoadGuard; cost =
	// PrefillWeight·uncached + LoadWeight·load, so the scores are the
	// negated costs; ties: lower load, then a random rotation so equal
	// costs spread), then the last-resort fill.
	k.profile = Profile{
		Name:    KVAwareType,
		Summary: Summary{Load: true, RequireAvailable: true},
		Pickers: []Picker{&kvRank{MaxScore{
			Name:    "kv-cost",
			Filters: []Filter{&LoadGuard{Abs: cfg.BalanceAbs, Rel: cfg.BalanceRel}},
			Scorers: []Weighted{{kvUncached{}, cfg.PrefillWeight}, {LoadScore{}, cfg.LoadWeight}},
			Ties:    []Tie{LowerLoad{}},
			Rand:    env.Rand,
		}}, LastResort()},
	}
	k.hub = env.KVHub
	for _, e := range env.Pool.Endpoints {
		if src, ok := e.KVSource(); ok {
			k.eps = append(k.eps, src)
		}
	}
	addrs := []string{cfg.Tokenizer.Address}
	if cfg.Tokenizer.Address == "" {
		addrs = addrs[:0]
		for _, e := range env.Pool.Endpoints {
			addrs = append(addrs, e.Address)
		}
	}
	k.tok = tokenize.New(tokenize.Options{Timeout: cfg.Tokenizer.Timeout.D(), CacheEntries: cfg.Tokenizer.CacheEntries}, addrs)
	return k
}

// Carry implements Stater: keep the index and live subscriptions.
func (k *KVAware) Carry(prev fleet.Policy) {
	old, ok := prev.(*KVAware)
	if !ok || old.sh == nil || old.cfg.BlockSize != k.cfg.BlockSize || old.cfg.MaxBlocks != k.cfg.MaxBlocks {
		k.fallback.Carry(prevFallback(prev))
		return
	}
	old.sh.adopted.Store(true)
	k.sh = &kvShared{idx: old.sh.idx, mgr: old.sh.mgr}
	k.tok.Adopt(old.tok)
	k.fallback.Carry(old.fallback)
}

func prevFallback(p fleet.Policy) fleet.Policy {
	if pa, ok := p.(*PrefixAffinity); ok {
		return pa
	}
	return nil
}

// Start implements Starter: create or resync the index subscriptions.
func (k *KVAware) Start(p *fleet.Pool) {
	if k.sh == nil {
		idx := kv.NewIndex(k.cfg.MaxBlocks)
		if k.cfg.BlockSize > 0 {
			idx.SetBlockSize(k.cfg.BlockSize)
		}
		k.sh = &kvShared{idx: idx, mgr: kv.NewManager(k.ctx, idx, kv.ManagerConfig{Hub: k.hub}, k.log)}
	}
	if err := k.sh.mgr.Sync(k.eps); err != nil {
		k.log.Warn().Err(err).Str(fleet.FieldPool, k.pool).Msg("kv-event subscriptions")
	}
	k.ids = make([]int, len(p.Endpoints))
	n := 0
	for i, e := range p.Endpoints {
		k.ids[i] = k.sh.idx.SourceID(e.Name)
		n = max(n, k.ids[i]+1)
	}
	k.at = make([]int32, n)
	for i := range k.at {
		k.at[i] = -1
	}
	for i, id := range k.ids {
		k.at[id] = int32(i)
	}
}

// Close implements Closer: stop subscriptions unless a newer policy took them.
func (k *KVAware) Close() {
	if k.sh != nil && !k.sh.adopted.Load() {
		k.sh.mgr.Close()
	}
}

// Fallbacks is how many requests went to the prefix-affinity fallback (tests, metrics).
func (k *KVAware) Fallbacks() uint64 {
	var n uint64
	for i := range k.fallbacks {
		n += k.fallbacks[i].Load()
	}
	return n
}

// FallbacksFor is how many requests fell back for one reason (tests).
func (k *KVAware) FallbacksFor(r KVFallback) uint64 { return k.fallbacks[r].Load() }

// KVFallback is why kv-aware could not key a request on token blocks;
// keep kvFallbackNames (metricfamilies.go) in sync.
type KVFallback int

// Fallback reasons.
const (
	// KVFallbackBlockSize: no block size yet (no KV event, no engine
	// cache_config_info, no block_size in config).
	KVFallbackBlockSize KVFallback = iota
	// KVFallbackTruncated: the body was cut at route_body, so the prompt
	// cannot be tokenized whole.
	KVFallbackTruncated
	// KVFallbackTokenizer: the tokenizer failed or is unreachable.
	KVFallbackTokenizer
	// KVFallbackNoTokens: no token-id prompt and tokenizer.mode none, or
	// nothing to tokenize.
	KVFallbackNoTokens
	// KVFallbackShort: the prompt is shorter than one block (no key to match).
	KVFallbackShort
	// KVFallbackAdapter: the request names a LoRA adapter. The engine keys
	// an adapter's blocks by it and the index holds base-model blocks only
	// (route/kv skips events with a LoRA), so a token match would be a
	// false hit; the fallback's prompt hashes are keyed by adapter.
	KVFallbackAdapter
	numKVFallbacks
)

// Sentinel errors of requestKeys: a fallback must not allocate.
var (
	errBlockSize = errors.New("block size not known yet")
	errTruncated = errors.New("body truncated at route_body")
	errNoTokens  = errors.New("no token ids")
	errAdapter   = errors.New("adapter request: the index holds base-model blocks")
)

// Index exposes the KV index (tests, metrics).
func (k *KVAware) Index() *kv.Index { return k.sh.idx }

// Pick implements Policy.
func (k *KVAware) Pick(r *fleet.Request, p *fleet.Pool, c *fleet.Choice) {
	b, _ := k.bufs.Get().(*kvBuf)
	if b == nil {
		b = &kvBuf{}
	}
	defer k.bufs.Put(b)
	bs := k.sh.idx.BlockSize()
	if bs == 0 {
		bs = k.learnBlockSize(p)
	}
	keys, why, err := k.requestKeys(r, bs, b)
	if err != nil || len(keys) == 0 {
		if k.cfg.Strict && !errors.Is(err, errAdapter) {
			switch {
			case errors.Is(err, tokenize.ErrUnavailable):
				c.Reject = fleet.RejectUnavailable
			default:
				c.Reject = fleet.RejectBadBody
			}
			return
		}
		if err == nil {
			why = KVFallbackShort
		}
		k.fallbacks[why].Add(1)
		// The fallback's prompt hashes are computed only here (from the
		// payload index), so the token path does not pay for hashing.
		if n := len(r.Payload.Body())/k.cfg.Fallback.BlockBytes + 1; cap(b.blocks) < n {
			b.blocks = make([]uint64, 0, n)
		}
		b.hasher.ResetFor(r, k.cfg.Fallback.BlockBytes, b.blocks)
		r.Payload.Prompt(&b.hasher)
		// The fallback reads its blocks from a copy (in b, not on the
		// stack: a profile's stages hold it): r stays the caller's, and
		// the blocks (in b) do not outlive this call.
		b.req = *r
		b.req.Blocks, b.req.PromptBytes = b.hasher.Out, b.hasher.Total
		k.fallback.Pick(&b.req, p, c)
		b.req = fleet.Request{}
		return
	}
	// Only the holders of the request's first block can hold any of its
	// blocks: the index asks them alone, and the rest stay at zero.
	b.m.Size(len(p.Endpoints))
	k.sh.idx.MatchFirst(keys, k.at, &b.m)
	b.cy.reset(r, p, c)
	b.cy.Match, b.cy.Stale, b.cy.Held, b.cy.Of = b.m.Blocks, b.m.Stale, b.m.Held, len(keys)
	k.profile.Run(&b.cy)
	b.cy.release()
	b.m.Reset()
}

// kvRank is the KV-cost ranking; its first choice's matched blocks (as
// the index holds them, stale or not) are the choice's Matched, and make
// the outcome affinity.
type kvRank struct{ MaxScore }

// Pick implements Picker.
func (r *kvRank) Pick(c *Cycle) {
	r.MaxScore.Pick(c)
	if f := c.First(); f != nil {
		c.Choice.Matched = c.Match[f.Index]
		if c.Choice.Matched > 0 {
			c.Choice.Outcome = fleet.OutcomeAffinity
		}
	}
}

// kvUncached scores minus the request's blocks e does not hold according
// to its KV events (unit: blocks); after a sequence gap (stale) only half
// of what it is thought to hold is trusted.
type kvUncached struct{}

// Score implements Scorer.
func (kvUncached) Score(c *Cycle, e *fleet.Endpoint) float64 {
	m := c.Match[e.Index]
	if c.Stale[e.Index] {
		m /= 2
	}
	return -float64(c.Of - m)
}

// learnBlockSize takes the block size an endpoint's engine reported
// (vLLM's cache_config_info, scraped with the load) while no KV event has
// taught the index one: a cold start keys requests from the first one.
// A decision looks at up to k.probes endpoints (0: all), from where the
// last one stopped: while no engine reports one (none scraped yet, an
// engine without cache_config_info), a large pool costs a decision what
// one of max_candidates endpoints does, and a report is taken within
// len/probes decisions.
func (k *KVAware) learnBlockSize(p *fleet.Pool) int {
	eps := p.Endpoints
	n, start := len(eps), 0
	if k.probes > 0 && k.probes < n {
		start = int((k.probed.Add(uint64(k.probes)) - uint64(k.probes)) % uint64(n))
		n = k.probes
	}
	for j := range n {
		i := start + j
		if i >= len(eps) {
			i -= len(eps)
		}
		if bs := eps[i].KVBlockSize(); bs > 0 {
			k.sh.idx.LearnBlockSize(bs)
			return k.sh.idx.BlockSize()
		}
	}
	return 0
}

// requestKeys returns the request's block keys: from token-id prompts
// directly, else through the tokenizer (cached). Without keys, why says
// what was missing.
func (k *KVAware) requestKeys(r *fleet.Request, bs int, b *kvBuf) (keys []uint64, why KVFallback, err error) {
	if r.Adapter {
		return nil, KVFallbackAdapter, errAdapter
	}
	if bs <= 0 {
		return nil, KVFallbackBlockSize, errBlockSize
	}
	if toks, ok := r.Payload.TokenIDs(); ok {
		k.tokenIDs.Add(1)
		if cap(b.keys) < len(toks)/bs+1 {
			b.keys = make([]uint64, 0, len(toks)/bs+1)
		}
		b.keys = kv.BlockKeys(toks, bs, b.keys[:0])
		return b.keys, KVFallbackShort, nil
	}
	if r.Truncated {
		return nil, KVFallbackTruncated, errTruncated
	}
	if k.cfg.Tokenizer.Mode != "remote" {
		return nil, KVFallbackNoTokens, errNoTokens
	}
	// The tokenizer gets the request's own JSON for the prompt, as vLLM's
	// /tokenize takes it (messages, else prompt).
	field, raw := "messages", r.Payload.Value("messages")
	if len(raw) == 0 {
		field, raw = "prompt", r.Payload.Value("prompt")
	}
	if len(raw) == 0 {
		return nil, KVFallbackNoTokens, errNoTokens
	}
	keys, err = k.tok.Keys(field, raw, r.Model, bs)
	if err != nil {
		k.tokenizeErrs.Add(1)
		return nil, KVFallbackTokenizer, err
	}
	k.tokenized.Add(1)
	return keys, KVFallbackShort, nil
}

// WriteMetricsOff renders, at 0, the policy metrics a dashboard or an
// alert reads for a pool whose policy does not write them (the KV index's
// without kv-aware): 0, not absent.
func (r *Registry) WriteMetricsOff(p *fleet.Pool, b *strings.Builder) {
	if _, kv := p.Policy.(*KVAware); !kv {
		writeKVMetricsOff(p, b)
	}
}

// writeKVMetricsOff renders the KV metrics of WriteMetrics a dashboard
// reads, at 0.
func writeKVMetricsOff(p *fleet.Pool, b *strings.Builder) {
	fmt.Fprintf(b, "turnout_kv_index_blocks{deployment=%q,pool=%q} 0\n", p.Deployment, p.Name)
	fmt.Fprintf(b, "turnout_kv_index_stale_sources{deployment=%q,pool=%q} 0\n", p.Deployment, p.Name)
	for _, e := range p.Endpoints {
		fmt.Fprintf(b, "turnout_kv_events_total{deployment=%q,pool=%q,endpoint=%q} 0\n", p.Deployment, p.Name, e.Name)
	}
}

// WriteMetrics implements MetricsWriter.
func (k *KVAware) WriteMetrics(p *fleet.Pool, b *strings.Builder) {
	st := k.sh.idx.Stats()
	fmt.Fprintf(b, "turnout_kv_index_blocks{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, st.Entries)
	fmt.Fprintf(b, "turnout_kv_index_capacity_blocks{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, st.Capacity)
	fmt.Fprintf(b, "turnout_kv_index_bytes{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, st.ApproxBytes)
	fmt.Fprintf(b, "turnout_kv_index_evictions_total{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, st.Evictions)
	fmt.Fprintf(b, "turnout_kv_index_stale_sources{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, st.Stale)
	fmt.Fprintf(b, "turnout_kv_index_block_size_tokens{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, st.BlockSize)
	// Events the index could not use, by why (kv/index.go): a high
	// orphan or misaligned count explains matches that never come.
	for _, r := range [...]struct {
		n string
		v uint64
	}{{"orphan", st.Orphans}, {"misaligned", st.Misaligned}, {"filtered", st.Filtered}, {"unknown_remove", st.UnknownRemoves}} {
		fmt.Fprintf(b, "turnout_kv_index_skipped_total{deployment=%q,pool=%q,reason=%q} %d\n", p.Deployment, p.Name, r.n, r.v)
	}
	for i := range k.fallbacks {
		fmt.Fprintf(b, "turnout_kv_fallbacks_total{deployment=%q,pool=%q,reason=%q} %d\n", p.Deployment, p.Name, KVFallback(i), k.fallbacks[i].Load())
	}
	fmt.Fprintf(b, "turnout_kv_tokenize_total{deployment=%q,pool=%q,result=\"ok\"} %d\n", p.Deployment, p.Name, k.tokenized.Load())
	fmt.Fprintf(b, "turnout_kv_tokenize_total{deployment=%q,pool=%q,result=\"error\"} %d\n", p.Deployment, p.Name, k.tokenizeErrs.Load())
	fmt.Fprintf(b, "turnout_kv_token_id_prompts_total{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, k.tokenIDs.Load())
	fmt.Fprintf(b, "turnout_kv_tokenizer_cache_hits_total{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, k.tok.Hits())
	for name, s := range k.sh.mgr.Stats() {
		fmt.Fprintf(b, "turnout_kv_events_total{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, name, s.Events)
		fmt.Fprintf(b, "turnout_kv_event_gaps_total{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, name, s.Gaps)
		fmt.Fprintf(b, "turnout_kv_event_malformed_total{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, name, s.Malformed)
		fmt.Fprintf(b, "turnout_kv_event_reconnects_total{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, name, s.Reconnects)
		for r, n := range s.Rejected {
			fmt.Fprintf(b, "turnout_kv_events_rejected_total{deployment=%q,pool=%q,endpoint=%q,reason=%q} %d\n", p.Deployment, p.Name, name, kv.RejectReason(r), n)
		}
	}
}

var (
	_ Picker              = (*kvRank)(nil)
	_ Scorer              = kvUncached{}
	_ fleet.Policy        = (*KVAware)(nil)
	_ fleet.Stater        = (*KVAware)(nil)
	_ fleet.Starter       = (*KVAware)(nil)
	_ fleet.Closer        = (*KVAware)(nil)
	_ fleet.MetricsWriter = (*KVAware)(nil)
)

// LoadAware implements LoadAware: the cost adds in-flight counts.
func (*KVAware) LoadAware() bool { return true }

var _ fleet.LoadAware = (*KVAware)(nil)
