package policy

import (
	"fmt"
	"sync"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// LoRA affinity (llm-d's lora-affinity scorer, production-stack's LoRA
// routing): a request for an adapter goes where the adapter is hot, so
// replicas do not swap adapters in and out of their max_lora GPU slots.
// An endpoint's hot set is what its engine last reported
// (vllm:lora_requests_info: adapters with running or waiting requests) and
// what this policy sent it lately (an LRU of max_lora adapters per
// endpoint, recorded at each decision: scrapes are 250 ms apart, decisions
// microseconds).

// LoRAStage is the registry name of the LoRA affinity scorer;
// LoRAAffinityType the built-in policy around it.
const (
	LoRAStage        = "lora-affinity"
	LoRAAffinityType = "lora-affinity"
)

// maxLoRASlots bounds the per-endpoint LRU (vLLM's max_loras is small).
const maxLoRASlots = 64

// LoRAParams are the params of the lora-affinity scorer.
type LoRAParams struct {
	// MaxLoRAs is the hot-set size assumed until an engine reports its
	// max_lora (vLLM's --max-loras). Default 4.
	MaxLoRAs int `yaml:"max_loras"`
}

// LoRAAffinityConfig are the params of the lora-affinity policy.
type LoRAAffinityConfig struct {
	LoRAParams `yaml:",inline"`
	// Weight is what a hot adapter is worth in requests of load, among
	// the endpoints the load guard keeps. Default 8.
	Weight float64 `yaml:"weight"`
	// BalanceAbs and BalanceRel are the load guard (prefix-affinity's): an
	// endpoint more than BalanceAbs requests above the least loaded and
	// more than BalanceRel times it is not a candidate, however hot.
	// Defaults 8 and 1.5; balance_abs 0 turns the guard off.
	BalanceAbs int64   `yaml:"balance_abs"`
	BalanceRel float64 `yaml:"balance_rel"`
	// PrefixWeight is what holding the whole prompt is worth in requests
	// of load (the prefix scorer: fraction of the prompt's blocks this
	// policy sent the endpoint), next to Weight × the adapter's score:
	// among the replicas where the adapter is hot, the prefix decides.
	// Default 8; 0 turns the prefix index off (no prompt hashing).
	PrefixWeight float64 `yaml:"prefix_weight"`
	// BasePrefix routes base-model requests by prefix × PrefixWeight −
	// load (under the load guard) instead of power of two choices.
	// Default false.
	BasePrefix   bool `yaml:"base_prefix"`
	PrefixParams `yaml:",inline"`
}

// DefaultLoRAAffinityConfig is lora-affinity's defaults.
func DefaultLoRAAffinityConfig() LoRAAffinityConfig {
	d := DefaultPrefixAffinityConfig()
	return LoRAAffinityConfig{LoRAParams: LoRAParams{MaxLoRAs: 4}, Weight: 8, BalanceAbs: 8, BalanceRel: 1.5,
		PrefixWeight: defaultLoRAPrefixWeight, BasePrefix: defaultLoRABasePrefix,
		PrefixParams: PrefixParams{BlockBytes: d.BlockBytes, CapacityBlocks: d.CapacityBlocks}}
}

// defaultLoRAPrefixWeight and defaultLoRABasePrefix: swept in the sim
// and replayed e2e with caches keyed by adapter and holding 10 % of the
// slice's blocks (BENCHMARKS.md, adapters and prefixes together): 16
// holds prefix-affinity's hits and beats prefix_weight 0's TTFT near the
// knee, at 1.5x its adapter switches (a third of prefix-affinity's); 8
// falls to 0.84-0.90x prefix-affinity's hits there. Above weight, a
// replica holding most of the prompt beats a hot one holding none: the
// prefill it saves outweighs an adapter load on long prompts.
// Base-model requests keep power of two choices unless base_prefix
// (unmeasured with adapters: every replayed request names one).
const (
	defaultLoRAPrefixWeight = 16
	defaultLoRABasePrefix   = false
)

// LoRAIndex is the scorer: 1 where the request's adapter is hot, 0.5
// where it is not but the endpoint has a free slot (spreading adapters
// before any replica must evict one), 0 where loading it evicts another;
// requests for a base model score 0 everywhere (unit: hot sets).
type LoRAIndex struct {
	maxLoRAs int
	eps      []loraLRU // by endpoint index
}

// loraLRU is one endpoint's recently routed adapters.
type loraLRU struct {
	mu   sync.Mutex
	n    int
	tick uint64
	keys [maxLoRASlots]uint64
	used [maxLoRASlots]uint64
}

func (l *loraLRU) find(h uint64) int {
	for i := 0; i < l.n; i++ {
		if l.keys[i] == h {
			return i
		}
	}
	return -1
}

// touch records h as just used, evicting the least recently used past capacity.
func (l *loraLRU) touch(h uint64, capacity int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tick++
	if i := l.find(h); i >= 0 {
		l.used[i] = l.tick
		return
	}
	capacity = min(max(capacity, 1), maxLoRASlots)
	for l.n > capacity { // the engine reported a smaller max_lora
		l.evict()
	}
	if l.n == capacity {
		l.evict()
	}
	l.keys[l.n], l.used[l.n] = h, l.tick
	l.n++
}

func (l *loraLRU) evict() {
	old := 0
	for i := 1; i < l.n; i++ {
		if l.used[i] < l.used[old] {
			old = i
		}
	}
	l.n--
	l.keys[old], l.used[old] = l.keys[l.n], l.used[l.n]
}

// state reports whether h is in the LRU and how many adapters it holds.
func (l *loraLRU) state(h uint64) (hot bool, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.find(h) >= 0, l.n
}

// NewLoRAScorer builds the lora-affinity scorer.
func NewLoRAScorer(cfg *config.StageConfig, env StageEnv) (Scorer, error) {
	p := LoRAParams{MaxLoRAs: 4}
	if err := cfg.DecodeParams(&p); err != nil {
		return nil, err
	}
	return newLoRAIndex(p, env.Pool)
}

func newLoRAIndex(p LoRAParams, pool *fleet.Pool) (*LoRAIndex, error) {
	if p.MaxLoRAs < 1 || p.MaxLoRAs > maxLoRASlots {
		return nil, fmt.Errorf("lora-affinity max_loras %d out of range [1, %d]", p.MaxLoRAs, maxLoRASlots)
	}
	return &LoRAIndex{maxLoRAs: p.MaxLoRAs, eps: make([]loraLRU, len(pool.Endpoints))}, nil
}

// capacity is e's hot-set size: its engine's max_lora, else the param.
func (x *LoRAIndex) capacity(l *fleet.LoRAState) int {
	if l != nil && l.MaxLoRA > 0 {
		return l.MaxLoRA
	}
	return x.maxLoRAs
}

// Score implements Scorer.
func (x *LoRAIndex) Score(c *Cycle, e *fleet.Endpoint) float64 {
	if !c.Req.Adapter || e.Index >= len(x.eps) {
		return 0
	}
	l := e.LoRA()
	hot, n := x.eps[e.Index].state(c.Req.AdapterHash)
	if hot || l != nil && l.Hot(c.Req.Model) {
		return 1
	}
	if l != nil {
		n = max(n, l.Slots())
	}
	if n < x.capacity(l) {
		return 0.5
	}
	return 0
}

// Record implements Recorder: the first choice now holds the adapter.
func (x *LoRAIndex) Record(c *Cycle) {
	if f := c.First(); c.Req.Adapter && f != nil && f.Index < len(x.eps) {
		x.eps[f.Index].touch(c.Req.AdapterHash, x.capacity(f.LoRA()))
	}
}

// AdapterGate opens a picker for requests for a LoRA adapter.
type AdapterGate struct{}

// Open implements Gate.
func (AdapterGate) Open(c *Cycle) bool { return c.Req.Adapter }

// firstOnly runs a picker only when nothing is picked yet.
type firstOnly struct{ Picker }

// Pick implements Picker.
func (f firstOnly) Pick(c *Cycle) {
	if c.Picked() == 0 {
		f.Picker.Pick(c)
	}
}

// LoRAAffinity is the lora-affinity policy: an adapter request goes to the
// best of weight × LoRAIndex + prefix_weight × prefix − load (ties: lower
// load, fewer recent decisions, a random rotation); a base-model request
// goes to the best of prefix_weight × prefix − load with base_prefix, else
// is least-request's (power of two choices); the fallbacks are the least
// loaded.
type LoRAAffinity struct {
	Profile
}

// LoadAware implements LoadAware.
func (*LoRAAffinity) LoadAware() bool { return true }

// LoRAPrefix is lora-affinity with a prefix index (prefix_weight > 0): it
// wants the prompt's block hashes, keeps its index across reloads and
// learns what other instances routed.
type LoRAPrefix struct {
	LoRAAffinity
	prefix *PrefixIndex
}

// BlockBytes implements PromptUser.
func (l *LoRAPrefix) BlockBytes() int { return l.prefix.blockBytes }

// Carry implements Stater.
func (l *LoRAPrefix) Carry(prev fleet.Policy) {
	if old, ok := prev.(*LoRAPrefix); ok {
		l.prefix.carry(old.prefix)
	}
}

// RecordPrefix implements PrefixRecorder.
func (l *LoRAPrefix) RecordPrefix(i int, blocks []uint64) { l.prefix.recordAt(i, blocks) }

// CachedBlocks reports the index size of the endpoint at index i (metrics, tests).
func (l *LoRAPrefix) CachedBlocks(i int) int { return l.prefix.lrus[i].Len() }

// BaseGate opens a picker for requests for a base model.
type BaseGate struct{}

// Open implements Gate.
func (BaseGate) Open(c *Cycle) bool { return !c.Req.Adapter }

// NewLoRAAffinityFactory returns the factory for lora-affinity.
func NewLoRAAffinityFactory() Factory {
	return func(pc *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
		cfg := DefaultLoRAAffinityConfig()
		if err := pc.DecodeParams(&cfg); err != nil {
			return nil, err
		}
		if cfg.Weight < 0 || cfg.Weight > 1e6 {
			return nil, fmt.Errorf("lora-affinity weight %v out of range [0, 1e6]", cfg.Weight)
		}
		if cfg.PrefixWeight < 0 || cfg.PrefixWeight > 1e6 {
			return nil, fmt.Errorf("lora-affinity prefix_weight %v out of range [0, 1e6] (0: off)", cfg.PrefixWeight)
		}
		rnd := env.Rand
		if rnd == nil {
			rnd = fleet.NewRand(1)
		}
		x, err := newLoRAIndex(cfg.LoRAParams, env.Pool)
		if err != nil {
			return nil, err
		}
		if cfg.BalanceAbs < 0 || cfg.BalanceRel < 1 {
			return nil, fmt.Errorf("lora-affinity balance_abs %d must be >= 0 and balance_rel %v >= 1", cfg.BalanceAbs, cfg.BalanceRel)
		}
		var guard []Filter
		if cfg.BalanceAbs > 0 {
			guard = []Filter{&LoadGuard{Abs: cfg.BalanceAbs, Rel: cfg.BalanceRel}}
		}
		adapter := &MaxScore{Name: LoRAStage, Gate: AdapterGate{}, Rand: rnd, Slots: 1, Filters: guard,
			Scorers: []Weighted{{x, cfg.Weight}, {LoadScore{}, 1}}, Ties: []Tie{LowerLoad{}, FewerRecent{}}}
		if cfg.PrefixWeight == 0 {
			return &LoRAAffinity{Profile{Name: LoRAAffinityType, Summary: Summary{Load: true, RequireAvailable: true},
				Pickers:   []Picker{adapter, firstOnly{&P2C{Rand: rnd}}, NewLeastLoaded(rnd)},
				Recorders: []Recorder{x}}}, nil
		}
		d := DefaultPrefixAffinityConfig()
		d.BlockBytes, d.CapacityBlocks = cfg.BlockBytes, cfg.CapacityBlocks
		if err := d.Validate(); err != nil {
			return nil, fmt.Errorf("lora-affinity: %w", err)
		}
		px := newPrefixIndex(cfg.BlockBytes, cfg.CapacityBlocks, env.Pool)
		adapter.Scorers = append(adapter.Scorers, Weighted{px, cfg.PrefixWeight})
		var base Picker = firstOnly{&P2C{Rand: rnd}}
		// The engine keys its prefix cache by adapter: a base-model prompt
		// can only serve base-model requests, so it is recorded only when
		// they follow the prefix.
		var record Recorder = adapterOnly{px}
		if cfg.BasePrefix {
			record = px
			base = &prefixMatched{&MaxScore{Name: "base-prefix", Gate: BaseGate{}, Rand: rnd, Slots: 1, Filters: guard,
				Scorers: []Weighted{{px, cfg.PrefixWeight}, {LoadScore{}, 1}}, Ties: []Tie{LowerLoad{}, FewerRecent{}}}, px}
		}
		return &LoRAPrefix{LoRAAffinity{Profile{Name: LoRAAffinityType, Summary: Summary{Load: true, RequireAvailable: true},
			Pickers:   []Picker{&prefixMatched{adapter, px}, base, NewLeastLoaded(rnd)},
			Recorders: []Recorder{x, record}}}, px}, nil
	}
}

// adapterOnly records only requests that name an adapter.
type adapterOnly struct{ Recorder }

// Record implements Recorder.
func (r adapterOnly) Record(c *Cycle) {
	if c.Req.Adapter {
		r.Recorder.Record(c)
	}
}

var (
	_ Scorer          = (*LoRAIndex)(nil)
	_ Recorder        = (*LoRAIndex)(nil)
	_ Gate            = AdapterGate{}
	_ fleet.Policy    = (*LoRAAffinity)(nil)
	_ fleet.LoadAware = (*LoRAAffinity)(nil)

	_ Gate                 = BaseGate{}
	_ Recorder             = adapterOnly{}
	_ fleet.PromptUser     = (*LoRAPrefix)(nil)
	_ fleet.Stater         = (*LoRAPrefix)(nil)
	_ fleet.PrefixRecorder = (*LoRAPrefix)(nil)
)
