package policy

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/turnout/turnout/route/estimator"
	"github.com/turnout/turnout/route/fleet"
)

// PredictedTTFTType is the registry name of PredictedTTFT.
const PredictedTTFTType = "predicted-ttft"

// PredictedTTFTConfig are the params of predicted-ttft.
//
// prefix-affinity (with the params of the same names) proposes the first
// choice; then for each available endpoint e the policy predicts the
// request's time to first token,
//
//	ttft(e) = c0 + c1·load(e) + c2·pendingKiB(e) + c3·uncachedKiB(e) + bends in load
//
// where load is Endpoint.Load (the engine's running + waiting, moved by
// the decisions since the scrape, every front's with cluster sync),
// pendingKiB the uncached prompt bytes of this instance's open decisions
// on e (the prefill queued ahead), and uncachedKiB the request's prompt
// bytes beyond the longest prefix e was sent (the prefix index), and
// takes the fastest instead when it is predicted faster by both margins
// (MarginRel and MarginMs). The coefficients are learned online per
// endpoint (route/estimator) from each request's first-token time as the
// proxy timed it (the feedback's tft), and, for an endpoint without such
// feedback lately, from its engine's time-to-first-token histogram per
// scrape interval; each endpoint's model is pulled towards a pool-wide
// one, which is pulled towards the prior below. The response headers'
// time (the feedback's TTFB) never teaches it: vLLM sends the headers of
// a stream before its first token.
//
// Why a guard on prefix-affinity rather than the plain minimum: greedy
// per-request predictions ignore what a placement does to later requests'
// hits, and a model with a median error of 20-40 % moved light-load picks
// that prefix-affinity got right (BENCHMARKS.md).
type PredictedTTFTConfig struct {
	// prefix-affinity's params, for the proposal and the prefix index.
	PrefixAffinityConfig `yaml:",inline"`
	// The prior: fixed cost, cost per request of load, per KiB of
	// uncached prompt (ms), before completions teach better ones.
	OverheadMs     float64 `yaml:"overhead_ms"`
	PerRequestMs   float64 `yaml:"per_request_ms"`
	PerQueuedKiBMs float64 `yaml:"per_queued_kib_ms"`
	PerKiBMs       float64 `yaml:"per_kib_ms"`
	// Memory is about how many completions per endpoint the model
	// remembers (the weight of a new one is 1/Memory).
	Memory int `yaml:"memory"`
	// MarginRel and MarginMs: another endpoint replaces prefix-affinity's
	// pick only when predicted at least this fraction and this many ms
	// faster.
	MarginRel      float64 `yaml:"margin_rel"`
	MarginMs       float64 `yaml:"margin_ms"`
	OverrideMisses bool    `yaml:"override_misses"`
	// ReclaimOverflow: a miss whose best-matching replica the load guard
	// refused (an overflow) may go back to a replica holding part of the
	// prompt when that is predicted faster by both margins: near
	// saturation the guard refuses long hits whose prefill saving dwarfs
	// the queue they would wait in.
	ReclaimOverflow bool `yaml:"reclaim_overflow"`
	// ReclaimAdmitted (with ReclaimOverflow): such an overflow miss goes back to the replica
	// holding the longest part of the prompt (at least MatchThreshold)
	// among those whose engine would start it at once
	// (Endpoint.Admits), without the model: there the guard saves no
	// queue and the miss pays the whole prefill.
	ReclaimAdmitted bool `yaml:"reclaim_admitted"`
}

// DefaultPredictedTTFTConfig returns the defaults.
func DefaultPredictedTTFTConfig() PredictedTTFTConfig {
	return PredictedTTFTConfig{
		PrefixAffinityConfig: DefaultPrefixAffinityConfig(),
		MarginRel:            0.5, MarginMs: 100,
		OverheadMs: estimator.DefaultCoef[0], PerRequestMs: estimator.DefaultCoef[1],
		PerQueuedKiBMs: estimator.DefaultCoef[2], PerKiBMs: estimator.DefaultCoef[3],
		Memory: 64, ReclaimOverflow: true, ReclaimAdmitted: true,
	}
}

// Validate checks the params.
func (c *PredictedTTFTConfig) Validate() error {
	if err := c.PrefixAffinityConfig.Validate(); err != nil {
		return fmt.Errorf("predicted-ttft: %w", err)
	}
	switch {
	case c.OverheadMs < 0 || c.PerRequestMs < 0 || c.PerQueuedKiBMs < 0 || c.PerKiBMs < 0:
		return fmt.Errorf("predicted-ttft overhead_ms, per_request_ms, per_queued_kib_ms and per_kib_ms must be >= 0")
	case c.Memory < 1 || c.Memory > 1<<20:
		return fmt.Errorf("predicted-ttft memory %d out of range [1, 1M]", c.Memory)
	case c.MarginRel < 0 || c.MarginRel >= 1:
		return fmt.Errorf("predicted-ttft margin_rel %v out of range [0, 1)", c.MarginRel)
	case c.MarginMs < 0:
		return fmt.Errorf("predicted-ttft margin_ms must be >= 0")
	}
	return nil
}

// PredictedTTFT routes each request as prefix-affinity does unless
// another replica is predicted to give its first token clearly sooner.
//
// Preset: prefix-affinity's pickers, then the TTFT guard (which may move
// a faster endpoint to the front); the prefix index records the first
// choice.
type PredictedTTFT struct {
	Profile
	cfg    PredictedTTFTConfig
	idx    *PrefixIndex
	sh     *ttftShared
	models []*estimator.Model // by endpoint index
	accs   []*ttftAcc         // by endpoint index
	// noteKeys name the figures a decision logs (Annotator).
	noteKeys [1]string
}

// ttftAcc sums the features and predictions of the decisions sent to one
// endpoint since its last engine scrape, to pair with the TTFT the engine
// reports for that interval (vLLM's time_to_first_token_seconds), the
// prior of an endpoint whose first tokens are not fed back.
type ttftAcc struct {
	mu   sync.Mutex
	x    estimator.Features
	pred float64
	n    int
	el   fleet.TTFTHistogram // the scrape the sums started after
	// intervals counts the scrape intervals the sums were rolled over;
	// fedAt is intervals+1 when a first-token time was last learned (0:
	// never). An interval mean teaches only engineQuietIntervals after it.
	intervals atomic.Uint64
	fedAt     atomic.Uint64
}

// engineQuietIntervals is how many scrape intervals without a fed-back
// first-token time let an endpoint's engine histogram teach its model
// again (16 s at the default 250 ms scrape): per-request times are
// better evidence than interval means, and the feedback of a long stream
// comes at its end, well after the intervals it started in.
const engineQuietIntervals = 64

// ttftShared is what survives reloads: the models and the error counts.
type ttftShared struct {
	prior  estimator.Coef
	ecfg   estimator.Config
	pool   *estimator.Model
	mu     sync.Mutex
	byName map[string]*estimator.Model
	accs   map[string]*ttftAcc
	// errs are the predictions' errors against what the models learned
	// from (route writes them: turnout_ttft_prediction_error_*).
	errs estimator.Errors
	// recentErr is the recent mean relative error (each capped at 1): the
	// guard's relative margin is never below it.
	recentErr estimator.EWMean
	// overrides counts the decisions where the guard replaced
	// prefix-affinity's pick.
	overrides atomic.Uint64
	learnt    atomic.Uint64
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
	return configured(DefaultPredictedTTFTConfig, func(cfg PredictedTTFTConfig, env fleet.PolicyEnv) fleet.Policy {
		return NewPredictedTTFT(cfg, env.Pool, env.Rand)
	})
}

// NewPredictedTTFT builds the policy for pool p (rnd: as NewPrefixAffinity).
func NewPredictedTTFT(cfg PredictedTTFTConfig, p *fleet.Pool, rnd *fleet.Rand) *PredictedTTFT {
	pt := &PredictedTTFT{cfg: cfg, noteKeys: [...]string{notePredictedTTFT: "predicted_ttft_ms"}}
	pa := NewPrefixAffinity(cfg.PrefixAffinityConfig, p, rnd)
	pt.idx = pa.idx
	prior := estimator.Coef{cfg.OverheadMs, cfg.PerRequestMs, cfg.PerQueuedKiBMs, cfg.PerKiBMs}
	copy(prior[4:], estimator.DefaultCoef[4:])
	ecfg := estimator.DefaultConfig()
	ecfg.Alpha = 1 / float64(cfg.Memory)
	pt.sh = &ttftShared{prior: prior, ecfg: ecfg, pool: estimator.New(ecfg, prior), byName: map[string]*estimator.Model{}, accs: map[string]*ttftAcc{}}
	pt.bindModels(p)
	pt.Profile = Profile{
		Name:      PredictedTTFTType,
		Summary:   pa.Summary,
		Pickers:   append(pa.Pickers[:len(pa.Pickers):len(pa.Pickers)], &ttftGuard{pt: pt}),
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

// features are e's prediction inputs for the cycle's request, given e's
// prefix match.
func (pt *PredictedTTFT) features(c *Cycle, e *fleet.Endpoint, match int) (x estimator.Features, load, pending int64, uncached int) {
	uncached = pt.uncached(c.Req, match)
	load, pending = e.Load(), e.PendingBytes()
	return estimator.Make(load, pending, uncached), load, pending, uncached
}

// uncached estimates the prompt bytes a replica matching match blocks
// does not hold. Routing hashes only the prompt's first route_body bytes:
// the rest counts as held in the proportion the hashed blocks are (a
// long prompt whose hashed head is all held is a document sent before,
// not a miss of everything past route_body).
func (pt *PredictedTTFT) uncached(r *fleet.Request, match int) int {
	bb, n := pt.cfg.BlockBytes, len(r.Blocks)
	hashed := n * bb
	if tail := r.PromptBytes - hashed; n > 0 && tail > bb {
		return max(0, hashed-match*bb) + tail/n*(n-min(match, n))
	}
	return max(0, r.PromptBytes-match*bb)
}

// ttftGuard is the last word on the first choice: prefix-affinity's
// pickers (hit, session tie, least-loaded fill) have filled the choice,
// and, when that pick holds part of the prompt (or OverrideMisses), the
// guard predicts every usable endpoint's TTFT; when it is a miss because
// the load guard refused the prompt's holder (ReclaimOverflow), the
// holders' TTFT. It moves the fastest to the
// front only when it beats prefix-affinity's pick by both margins
// (MarginMs, and MarginRel or the model's recent error, whichever is
// larger): a noisy model costs a light load nothing (prefix-affinity's
// hits and load guard decide there), while near saturation a hit whose
// queue the balance guard lets through but costs more than the prefill
// it saves is moved. The first choice's prediction goes with the decision
// (learned from at completion).
type ttftGuard struct{ pt *PredictedTTFT }

// Pick implements Picker.
func (g *ttftGuard) Pick(c *Cycle) {
	def := c.First()
	if def == nil {
		return
	}
	pt := g.pt
	// A model is not trusted with differences smaller than its recent
	// error: with a median error of 0.7 behind a busy proxy (e2e), the
	// plain margin moved 64 hits and cost p99 (BENCHMARKS.md).
	rel := max(pt.cfg.MarginRel, pt.sh.recentErr.Load())
	// The prefix-hit picker's Matched is its pick's match; any other
	// proposal (a session tie, the fill) is looked up.
	dmatch := c.Choice.Matched
	if dmatch == 0 {
		dmatch = pt.idx.lrus[def.Index].matchLen(c.Req.Blocks)
	}
	dx, dload, dpending, duncached := pt.features(c, def, dmatch)
	dpred := pt.models[def.Index].Predict(&dx)
	best, bestPred, bestLoad := def, dpred, dload
	bx, bpending, buncached, bmatch := dx, dpending, duncached, dmatch
	// A miss is moved only with OverrideMisses, or, when the load guard
	// refused the replica holding most of the prompt (an overflow), to a
	// replica holding part of it (ReclaimOverflow); otherwise no endpoint
	// is looked at. Nor when even a prediction of 0 ms would not clear
	// the margins (predictions are >= 0): no candidate can, so none is
	// predicted.
	var eps []*fleet.Endpoint
	holdersOnly := dmatch == 0 && !pt.cfg.OverrideMisses && pt.cfg.ReclaimOverflow && c.Choice.Outcome == fleet.OutcomeOverflow
	if holdersOnly {
		rel = pt.cfg.MarginRel
	}
	admitted := holdersOnly && pt.cfg.ReclaimAdmitted
	if (dmatch > 0 || pt.cfg.OverrideMisses || holdersOnly) && (admitted || pt.cfg.overrides(dpred, 0, rel)) {
		eps = c.Candidates()
	}
	// The admitted holder with the longest match (ReclaimAdmitted).
	var adm *fleet.Endpoint
	var admLoad int64
	admMatch := max(1, int(math.Ceil(pt.cfg.MatchThreshold*float64(len(c.Req.Blocks))))) - 1
	// With an objective the objective decides, not the margins (predictedttft_slo.go).
	obj := c.Req.TTFTObjectiveMs > 0
	if obj {
		b := pt.meetObjective(c, float64(c.Req.TTFTObjectiveMs), ttftCand{def, dx, dpred, dload, dpending, duncached, dmatch})
		best, bestPred, bestLoad = b.e, b.pred, b.load
		bx, bpending, buncached, bmatch = b.x, b.pending, b.uncached, b.match
		eps = nil
	}
	for _, e := range eps {
		if e == def || !c.Usable(e) {
			continue
		}
		// The prediction without the prompt's prefill bounds e's from
		// below (coefficients are >= 0): when even that does not clear
		// the margins, e's prefix match is not looked up.
		load, pending := e.Load(), e.PendingBytes()
		if admitted && e.Admits(load) {
			if match := pt.idx.lrus[e.Index].matchLen(c.Req.Blocks); match > admMatch || match == admMatch && adm != nil && load < admLoad {
				adm, admMatch, admLoad = e, match, load
			}
		}
		x := estimator.Make(load, pending, 0)
		m := pt.models[e.Index]
		if !pt.cfg.overrides(dpred, m.Predict(&x), rel) {
			continue
		}
		match := pt.idx.lrus[e.Index].matchLen(c.Req.Blocks)
		if holdersOnly && match == 0 {
			continue
		}
		x, _, _, uncached := pt.features(c, e, match)
		pred := m.Predict(&x)
		if pred < bestPred || pred == bestPred && load < bestLoad {
			best, bestPred, bestLoad = e, pred, load
			bx, bpending, buncached, bmatch = x, pending, uncached, match
		}
	}
	if adm != nil {
		x, _, pending, uncached := pt.features(c, adm, admMatch)
		best, bestPred, bestLoad = adm, pt.models[adm.Index].Predict(&x), admLoad
		bx, bpending, buncached, bmatch = x, pending, uncached, admMatch
	}
	if best != def && (obj || adm != nil || pt.cfg.overrides(dpred, bestPred, rel)) {
		pt.sh.overrides.Add(1)
		c.Choice.Endpoints = toFront(c.Choice.Endpoints, c.start, best)
		c.Choice.Matched = bmatch
		c.Choice.Outcome = fleet.OutcomeBalanced
		if bmatch > 0 {
			c.Choice.Outcome = fleet.OutcomeAffinity
		}
	} else {
		best, bestPred, bestLoad = def, dpred, dload
		bx, bpending, buncached = dx, dpending, duncached
	}
	pt.noteDecision(best, &bx, bestPred)
	ttft := float32(max(bestPred, 1e-3))
	c.Choice.Notes.Set(notePredictedTTFT, ttft)
	c.Choice.Predicted = fleet.Prediction{
		TTFTMs: ttft,
		Load:   int32(min(bestLoad, math.MaxInt32)), Pending: int32(min(bpending, math.MaxInt32)),
		Uncached: int32(min(buncached, math.MaxInt32)),
	}
}

// overrides reports whether a prediction of alt ms beats def ms by
// MarginMs and by the relative margin rel (1: never).
func (c *PredictedTTFTConfig) overrides(def, alt, rel float64) bool {
	return rel < 1 && def-alt >= c.MarginMs && alt <= def*(1-rel)
}

// toFront moves e to dst[start], shifting the endpoints before its old
// place (or, when it was not chosen, all of them, the last falling off a
// full choice) one back: the fallbacks keep their order.
func toFront(dst []*fleet.Endpoint, start int, e *fleet.Endpoint) []*fleet.Endpoint {
	j := start
	for j < len(dst) && dst[j] != e {
		j++
	}
	if j == len(dst) {
		if len(dst) < cap(dst) {
			dst = append(dst, nil)
		} else {
			j--
		}
	}
	copy(dst[start+1:j+1], dst[start:j])
	dst[start] = e
	return dst
}

// noteDecision adds a decision to its endpoint's interval sums; the first
// decision after a new engine scrape first learns the interval that ended,
// unless the endpoint's first tokens were fed back lately: the engine's
// mean TTFT over it against the mean features of the decisions sent in it
// (a linear model's prediction of a mean is the prediction at the mean
// features; the bends make it approximate).
func (pt *PredictedTTFT) noteDecision(e *fleet.Endpoint, x *estimator.Features, pred float64) {
	a := pt.accs[e.Index]
	a.mu.Lock()
	defer a.mu.Unlock()
	if el := e.EngineTTFT(); el != a.el {
		n := a.intervals.Add(1)
		fed := a.fedAt.Load()
		quiet := fed == 0 || n-min(fed, n) >= engineQuietIntervals
		if prev := a.el; quiet && prev.Known() && el.Known() && a.n > 0 && el.Count() > prev.Count() {
			k := float64(el.Count() - prev.Count())
			y := (el.Seconds() - prev.Seconds()) / k * 1000
			var xm estimator.Features
			for i := range xm {
				xm[i] = a.x[i] / float64(a.n)
			}
			pt.learn(e.Index, estimator.EngineMean, &xm, a.pred/float64(a.n), y)
		}
		a.x, a.pred, a.n, a.el = estimator.Features{}, 0, 0, el
	}
	for i := range a.x {
		a.x[i] += x[i]
	}
	a.pred += pred
	a.n++
}

// learn teaches endpoint i's model (and the pool's) one observation from src.
func (pt *PredictedTTFT) learn(i int, src estimator.Source, x *estimator.Features, predicted, observed float64) {
	if observed < 0 || math.IsNaN(observed) {
		return
	}
	pt.sh.errs.Observe(src, predicted, observed)
	pt.sh.recentErr.Observe(min(math.Abs(predicted-observed)/max(observed, 1), 1), pt.sh.ecfg.Alpha)
	pt.sh.learnt.Add(1)
	pt.sh.pool.Observe(x, observed, &pt.sh.prior)
	poolCoef := pt.sh.pool.Coef()
	pt.models[i].Observe(x, observed, &poolCoef)
}

// LearnTTFT implements fleet.TTFTLearner: one request's first-token time
// teaches the model at the features it was predicted from (on the
// feedback path: a small lock and an 8x8 solve, nothing kept per request),
// and keeps the endpoint's engine interval means from teaching it for a
// while.
func (pt *PredictedTTFT) LearnTTFT(e *fleet.Endpoint, p fleet.Prediction, firstTokenMs int64) {
	if e.Index < 0 || e.Index >= len(pt.models) || firstTokenMs < 0 {
		return
	}
	if a := pt.accs[e.Index]; a != nil {
		a.fedAt.Store(a.intervals.Load() + 1)
	}
	x := estimator.Make(int64(p.Load), int64(p.Pending), int(p.Uncached))
	pt.learn(e.Index, estimator.FirstToken, &x, float64(p.TTFTMs), float64(firstTokenMs))
}

// PredictionErrors are the predictions' errors by what the model learned
// from (turnout_ttft_prediction_error_seconds and _ratio, /readyz?verbose).
func (pt *PredictedTTFT) PredictionErrors() *estimator.Errors { return &pt.sh.errs }

// Overrides is how many decisions the guard took from prefix-affinity.
func (pt *PredictedTTFT) Overrides() uint64 { return pt.sh.overrides.Load() }

// ModelCoef are endpoint i's model's coefficients (tests).
func (pt *PredictedTTFT) ModelCoef(i int) estimator.Coef { return pt.models[i].Coef() }

// Learnt is how many observations the models learned from (tests).
func (pt *PredictedTTFT) Learnt() uint64 { return pt.sh.learnt.Load() }

// notePredictedTTFT is the index of the predicted TTFT among the figures
// predicted-ttft logs with a decision (NoteKeys).
const notePredictedTTFT = 0

// NoteKeys implements Annotator: the predicted TTFT of the first choice.
func (pt *PredictedTTFT) NoteKeys() []string { return pt.noteKeys[:] }

// BlockBytes implements PromptUser.
func (pt *PredictedTTFT) BlockBytes() int { return pt.cfg.BlockBytes }

// LoadAware implements LoadAware.
func (*PredictedTTFT) LoadAware() bool { return true }

// RecordPrefix implements PrefixRecorder (cluster sync).
func (pt *PredictedTTFT) RecordPrefix(i int, blocks []uint64) { pt.idx.recordAt(i, blocks) }

var ttftTerms = [estimator.N]string{"overhead_ms", "per_request_ms", "per_queued_kib_ms", "per_kib_ms", "per_request_over_4_ms", "per_request_over_8_ms", "per_request_over_16_ms", "per_request_over_32_ms"}

// WriteMetrics implements MetricsWriter (the prediction errors are
// route's: one family across pools).
func (pt *PredictedTTFT) WriteMetrics(p *fleet.Pool, b *strings.Builder) {
	fmt.Fprintf(b, "turnout_ttft_overrides_total{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, pt.sh.overrides.Load())
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
	_ fleet.Annotator      = (*PredictedTTFT)(nil)
	_ Picker               = (*ttftGuard)(nil)
)
