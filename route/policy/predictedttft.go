package policy

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/estimator"
	"github.com/turnout/turnout/route/fleet"
)

// PredictedTTFTType is the registry name of PredictedTTFT.
const PredictedTTFTType = "predicted-ttft"

// PredictedTTFTConfig are the params of predicted-ttft.
//
// For each available endpoint e the policy predicts the request's time to
// first token,
//
//	ttft(e) = c0 + c1·load(e) + c2·pendingKiB(e) + c3·uncachedKiB(e)
//
// where load is Endpoint.Load (the engine's running + waiting, moved by
// the decisions since the scrape, every front's with cluster sync),
// pendingKiB the uncached prompt bytes of this instance's open decisions
// on e (the prefill queued ahead), and uncachedKiB the request's prompt
// bytes beyond the longest prefix e was sent (prefix-affinity's index),
// and picks the lowest. The coefficients are
// learned online per endpoint from the completions' TTFB (the proxy's
// feedback line; route/estimator), pulled towards a pool-wide model, which
// is pulled towards the params below. A cache hit wins exactly when its
// saved prefill outweighs the queue it waits in: no match threshold, no
// imbalance guard.
type PredictedTTFTConfig struct {
	BlockBytes     int `yaml:"block_bytes"`
	CapacityBlocks int `yaml:"capacity_blocks"` // per endpoint
	// The prior: fixed cost, cost per request of load, per KiB of
	// uncached prompt (ms), before completions teach better ones.
	OverheadMs     float64 `yaml:"overhead_ms"`
	PerRequestMs   float64 `yaml:"per_request_ms"`
	PerQueuedKiBMs float64 `yaml:"per_queued_kib_ms"`
	PerKiBMs       float64 `yaml:"per_kib_ms"`
	// Memory is about how many completions per endpoint the model
	// remembers (the weight of a new one is 1/Memory).
	Memory int `yaml:"memory"`
}

// DefaultPredictedTTFTConfig returns the defaults.
func DefaultPredictedTTFTConfig() PredictedTTFTConfig {
	d := DefaultPrefixAffinityConfig()
	return PredictedTTFTConfig{
		BlockBytes: d.BlockBytes, CapacityBlocks: d.CapacityBlocks,
		OverheadMs: estimator.DefaultCoef[0], PerRequestMs: estimator.DefaultCoef[1],
		PerQueuedKiBMs: estimator.DefaultCoef[2], PerKiBMs: estimator.DefaultCoef[3],
		Memory: 64,
	}
}

// Validate checks the params.
func (c *PredictedTTFTConfig) Validate() error {
	pa := DefaultPrefixAffinityConfig()
	pa.BlockBytes, pa.CapacityBlocks = c.BlockBytes, c.CapacityBlocks
	if err := pa.Validate(); err != nil {
		return fmt.Errorf("predicted-ttft: %w", err)
	}
	switch {
	case c.OverheadMs < 0 || c.PerRequestMs < 0 || c.PerQueuedKiBMs < 0 || c.PerKiBMs < 0:
		return fmt.Errorf("predicted-ttft overhead_ms, per_request_ms, per_queued_kib_ms and per_kib_ms must be >= 0")
	case c.Memory < 1 || c.Memory > 1<<20:
		return fmt.Errorf("predicted-ttft memory %d out of range [1, 1M]", c.Memory)
	}
	return nil
}

// PredictedTTFT routes each request where it is predicted to get its first
// token soonest.
//
// Preset: the predicted-TTFT ranking (ties: lower load, then a random
// rotation) for the first choice, the least-loaded fill for the fallbacks;
// the prefix index records the first choice.
type PredictedTTFT struct {
	Profile
	cfg    PredictedTTFTConfig
	idx    *PrefixIndex
	sh     *ttftShared
	models []*estimator.Model // by endpoint index
	accs   []*ttftAcc         // by endpoint index
}

// ttftAcc sums the features and predictions of the decisions sent to one
// endpoint since its last engine scrape, to pair with the TTFT the engine
// reports for that interval (vLLM's time_to_first_token_seconds: the
// proxies' TTFB is the response headers' time, which comes before the
// first token of a stream, so it cannot teach a TTFT).
type ttftAcc struct {
	mu   sync.Mutex
	x    estimator.Features
	pred float64
	n    int
	el   *fleet.EngineLoad // the scrape the sums started after
}

// ttftShared is what survives reloads: the models and the error counts.
type ttftShared struct {
	prior  estimator.Coef
	ecfg   estimator.Config
	pool   *estimator.Model
	mu     sync.Mutex
	byName map[string]*estimator.Model
	accs   map[string]*ttftAcc
	errs   estimator.ErrorHistogram
	learnt atomic.Uint64
	// fromEngine is set once an engine reported TTFTs: from then on the
	// feedback's TTFB is not learned from.
	fromEngine atomic.Bool
}

func (sh *ttftShared) model(name string) (*estimator.Model, *ttftAcc) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	m := sh.byName[name]
	if m == nil {
		m = estimator.New(sh.ecfg, sh.pool.Coef())
		sh.byName[name] = m
		sh.accs[name] = &ttftAcc{}
	}
	return m, sh.accs[name]
}

// NewPredictedTTFTFactory returns the factory for predicted-ttft.
func NewPredictedTTFTFactory() Factory {
	return func(pc *config.PolicyConfig, env fleet.PolicyEnv) (fleet.Policy, error) {
		cfg := DefaultPredictedTTFTConfig()
		if err := pc.DecodeParams(&cfg); err != nil {
			return nil, err
		}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return NewPredictedTTFT(cfg, env.Pool, env.Rand), nil
	}
}

// NewPredictedTTFT builds the policy for pool p.
func NewPredictedTTFT(cfg PredictedTTFTConfig, p *fleet.Pool, rnd *fleet.Rand) *PredictedTTFT {
	if rnd == nil {
		rnd = fleet.NewRand(1)
	}
	pt := &PredictedTTFT{cfg: cfg}
	pt.idx = &PrefixIndex{blockBytes: cfg.BlockBytes, capacity: cfg.CapacityBlocks}
	for _, e := range p.Endpoints {
		pt.idx.lrus = append(pt.idx.lrus, newBlockLRU(cfg.CapacityBlocks))
		pt.idx.names = append(pt.idx.names, e.Name)
	}
	prior := estimator.Coef{cfg.OverheadMs, cfg.PerRequestMs, cfg.PerQueuedKiBMs, cfg.PerKiBMs}
	copy(prior[4:], estimator.DefaultCoef[4:])
	ecfg := estimator.DefaultConfig()
	ecfg.Alpha = 1 / float64(cfg.Memory)
	pt.sh = &ttftShared{prior: prior, ecfg: ecfg, pool: estimator.New(ecfg, prior), byName: map[string]*estimator.Model{}, accs: map[string]*ttftAcc{}}
	pt.bindModels(p)
	pt.Profile = Profile{
		Name:      PredictedTTFTType,
		Summary:   Summary{Load: true, RequireAvailable: true},
		Pickers:   []Picker{&ttftRank{pt: pt, Rand: rnd}, NewLeastLoaded(rnd)},
		Recorders: []Recorder{pt.idx},
	}
	return pt
}

func (pt *PredictedTTFT) bindModels(p *fleet.Pool) {
	pt.models, pt.accs = pt.models[:0], pt.accs[:0]
	for _, e := range p.Endpoints {
		m, a := pt.sh.model(e.Name)
		pt.models, pt.accs = append(pt.models, m), append(pt.accs, a)
	}
}

// Carry implements Stater: the learned models survive reloads (when the
// prior did not change), the prefix index as prefix-affinity's does.
func (pt *PredictedTTFT) Carry(prev fleet.Policy) {
	old, ok := prev.(*PredictedTTFT)
	if !ok {
		return
	}
	pt.idx.carry(old.idx)
	if old.sh.prior == pt.sh.prior && old.sh.ecfg == pt.sh.ecfg {
		pt.sh = old.sh
		pt.models, pt.accs = pt.models[:0], pt.accs[:0]
		for _, n := range pt.idx.names {
			m, a := pt.sh.model(n)
			pt.models, pt.accs = append(pt.models, m), append(pt.accs, a)
		}
	}
}

// features are e's prediction inputs for the cycle's request.
func (pt *PredictedTTFT) features(c *Cycle, e *fleet.Endpoint) (x estimator.Features, load, pending int64, uncached, match int) {
	match = pt.idx.lrus[e.Index].matchLen(c.Req.Blocks)
	uncached = max(0, c.Req.PromptBytes-match*pt.cfg.BlockBytes)
	load, pending = e.Load(), e.PendingBytes()
	return estimator.Make(load, pending, uncached), load, pending, uncached, match
}

// ttftSteps sets the resolution of the ranking: predictions are compared
// as round(ln(1+ms)·ttftSteps), so those within about 1/ttftSteps of each
// other (relative) tie. Relative rather than absolute, so the resolution
// holds for fast and slow models alike. 4 (about 25 %): on the Mooncake
// sim, p90/p99 within 1 % of prefix-affinity's at the trace's rate and at
// 1.6x; 5 was 0.3 % behind at 1x but 3-5 % at 1.6x, 10 and an absolute
// 10 ms step 1-7 % (BENCHMARKS.md, issue 27).
var ttftSteps = 4.0

// Predictions within ttftSteps' resolution are a tie, broken by load and then by
// the fewest recent decisions, as the least-loaded fill does: a model's
// noise does not decide between equally good replicas.

// ttftRank is the ranking, written out rather than a MaxScore of
// ttftScore (the same order: quantized prediction, then lower load, then
// fewer recent decisions, then a random rotation) so each endpoint's
// prefix match and prediction are computed once: its first choice's
// prediction goes with the decision (learned from at completion) and its
// match makes the outcome affinity.
type ttftRank struct {
	pt   *PredictedTTFT
	Rand *fleet.Rand
}

// Pick implements Picker.
func (r *ttftRank) Pick(c *Cycle) {
	eps := c.Pool.Endpoints
	n := len(eps)
	if n == 0 || !c.Room() {
		return
	}
	off := r.Rand.Intn(n)
	var best *fleet.Endpoint
	var bestScore, bestPred float64
	var bestLoad, bestPending int64
	var bestRecent uint64
	recentKnown := false
	var bestUncached, bestMatch int
	var bestX estimator.Features
	for j := range n {
		i := j + off
		if i >= n {
			i -= n
		}
		e := eps[i]
		if !c.Usable(e) || fleet.Contains(c.Choice.Endpoints, e) {
			continue
		}
		x, load, pending, uncached, match := r.pt.features(c, e)
		pred := r.pt.models[e.Index].Predict(&x)
		score := math.Round(math.Log1p(pred) * ttftSteps)
		if best != nil {
			if score > bestScore || score == bestScore && load > bestLoad {
				continue
			}
			if score == bestScore && load == bestLoad {
				if !recentKnown {
					bestRecent, recentKnown = best.Recent(), true
				}
				rec := e.Recent()
				if rec >= bestRecent {
					continue
				}
				bestRecent = rec
			} else {
				recentKnown = false
			}
		}
		best, bestScore, bestPred, bestLoad, bestPending, bestUncached, bestMatch = e, score, pred, load, pending, uncached, match
		bestX = x
	}
	if best == nil {
		return
	}
	c.Choice.Endpoints = append(c.Choice.Endpoints, best)
	c.Choice.Matched = bestMatch
	if bestMatch > 0 {
		c.Choice.Outcome = fleet.OutcomeAffinity
	}
	r.pt.noteDecision(best, &bestX, bestPred)
	c.Choice.Predicted = fleet.Prediction{
		TTFTMs: float32(max(bestPred, 1e-3)),
		Load:   int32(min(bestLoad, math.MaxInt32)), Pending: int32(min(bestPending, math.MaxInt32)),
		Uncached: int32(min(bestUncached, math.MaxInt32)),
	}
}

// noteDecision adds a decision to its endpoint's interval sums; the first
// decision after a new engine scrape first learns the interval that ended:
// the engine's mean TTFT over it against the mean features of the
// decisions sent in it (a linear model's prediction of a mean is the
// prediction at the mean features; the bends make it approximate).
func (pt *PredictedTTFT) noteDecision(e *fleet.Endpoint, x *estimator.Features, pred float64) {
	a := pt.accs[e.Index]
	a.mu.Lock()
	defer a.mu.Unlock()
	if el := e.Engine(); el != a.el {
		if prev := a.el; prev != nil && el != nil && a.n > 0 && el.TTFTCount > prev.TTFTCount {
			k := float64(el.TTFTCount - prev.TTFTCount)
			y := (el.TTFTSeconds - prev.TTFTSeconds) / k * 1000
			var xm estimator.Features
			for i := range xm {
				xm[i] = a.x[i] / float64(a.n)
			}
			pt.learn(e.Index, &xm, a.pred/float64(a.n), y)
			pt.sh.fromEngine.Store(true)
		}
		a.x, a.pred, a.n, a.el = estimator.Features{}, 0, 0, el
	}
	for i := range a.x {
		a.x[i] += x[i]
	}
	a.pred += pred
	a.n++
}

// learn teaches endpoint i's model (and the pool's) one observation.
func (pt *PredictedTTFT) learn(i int, x *estimator.Features, predicted, observed float64) {
	if observed <= 0 || math.IsNaN(observed) {
		return
	}
	pt.sh.errs.Observe(predicted, observed)
	pt.sh.learnt.Add(1)
	pt.sh.pool.Observe(x, observed, &pt.sh.prior)
	poolCoef := pt.sh.pool.Coef()
	pt.models[i].Observe(x, observed, &poolCoef)
}

// LearnTTFT implements fleet.TTFTLearner.
func (pt *PredictedTTFT) LearnTTFT(e *fleet.Endpoint, p fleet.Prediction, ttfbMs int64) {
	if e.Index < 0 || e.Index >= len(pt.models) || ttfbMs <= 0 || pt.sh.fromEngine.Load() {
		// 0 ms: the response headers came before any work (a streamed
		// response behind a proxy that logs header time), no TTFT. Once
		// the engines report TTFTs, those teach instead.
		return
	}
	x := estimator.Make(int64(p.Load), int64(p.Pending), int(p.Uncached))
	pt.learn(e.Index, &x, float64(p.TTFTMs), float64(ttfbMs))
}

// PredictionErrorMedian is the median relative prediction error so far
// (NaN before any completion; benchmarks, tests).
func (pt *PredictedTTFT) PredictionErrorMedian() float64 { return pt.sh.errs.Median() }

// Learnt is how many observations the models learned from (tests).
func (pt *PredictedTTFT) Learnt() uint64 { return pt.sh.learnt.Load() }

// BlockBytes implements PromptUser.
func (pt *PredictedTTFT) BlockBytes() int { return pt.cfg.BlockBytes }

// LoadAware implements LoadAware.
func (*PredictedTTFT) LoadAware() bool { return true }

// RecordPrefix implements PrefixRecorder (cluster sync).
func (pt *PredictedTTFT) RecordPrefix(i int, blocks []uint64) { pt.idx.recordAt(i, blocks) }

var ttftTerms = [estimator.N]string{"overhead_ms", "per_request_ms", "per_queued_kib_ms", "per_kib_ms", "per_request_over_4_ms", "per_request_over_8_ms", "per_request_over_16_ms", "per_request_over_32_ms"}

// WriteMetrics implements MetricsWriter.
func (pt *PredictedTTFT) WriteMetrics(p *fleet.Pool, b *strings.Builder) {
	var cum uint64
	for i := range pt.sh.errs.Counts {
		cum += pt.sh.errs.Counts[i].Load()
		le := "+Inf"
		if i < len(estimator.ErrorBuckets) {
			le = fmt.Sprint(estimator.ErrorBuckets[i])
		}
		fmt.Fprintf(b, "turnout_ttft_prediction_error_ratio_bucket{deployment=%q,pool=%q,le=%q} %d\n", p.Deployment, p.Name, le, cum)
	}
	fmt.Fprintf(b, "turnout_ttft_prediction_error_ratio_count{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, cum)
	if med := pt.sh.errs.Median(); !math.IsNaN(med) {
		fmt.Fprintf(b, "turnout_ttft_prediction_error_median_ratio{deployment=%q,pool=%q} %g\n", p.Deployment, p.Name, med)
	}
	for i, e := range p.Endpoints {
		if i >= len(pt.models) {
			break
		}
		c := pt.models[i].Coef()
		for k, term := range ttftTerms {
			fmt.Fprintf(b, "turnout_ttft_model_coefficient{deployment=%q,pool=%q,endpoint=%q,term=%q} %g\n", p.Deployment, p.Name, e.Name, term, c[k])
		}
	}
}

var (
	_ fleet.Policy         = (*PredictedTTFT)(nil)
	_ fleet.PromptUser     = (*PredictedTTFT)(nil)
	_ fleet.Stater         = (*PredictedTTFT)(nil)
	_ fleet.LoadAware      = (*PredictedTTFT)(nil)
	_ fleet.PrefixRecorder = (*PredictedTTFT)(nil)
	_ fleet.MetricsWriter  = (*PredictedTTFT)(nil)
	_ fleet.TTFTLearner    = (*PredictedTTFT)(nil)
	_ Picker               = (*ttftRank)(nil)
)
