// Package estimator learns, online and per replica, how long a request
// waits for its first token: a linear model of TTFT on what the router
// knows when it decides (the replica's load, the prompt bytes the replica
// does not hold yet), fitted by exponentially weighted least squares with
// a ridge towards prior coefficients, in fixed-size arrays. Predicting is
// a handful of multiplications on atomically published coefficients and
// never locks or allocates; learning (one completion's first-token time,
// or an engine's interval mean) takes a small lock and solves an N x N
// (8x8) system.
package estimator

import (
	"math"
	"sync"
	"sync/atomic"
)

// N is the number of features.
const N = 8

// Features of one (request, replica) pair: 1, the replica's load (running
// + waiting requests), the prefill work queued ahead (uncached prompt KiB
// of the requests this router sent there and that have not completed:
// with chunked prefill a request shares the prefill budget with theirs),
// the request's own uncached prompt in KiB, and the load beyond 4, 8, 16
// and 32 requests: a replica admits up to its running slots at once and
// queues the rest, so the wait grows in a bend the model places where the
// data say (a piecewise-linear curve in the load, knots at the usual
// max_num_seqs scales), without knowing the engine's settings.
type Features [N]float64

// Knots are the loads where the queue curve may bend.
var Knots = [...]float64{4, 8, 16, 32}

// Make returns the features of a replica with load requests, pendingBytes
// of prefill queued by this router, and uncachedBytes of the prompt not in
// its cache.
func Make(load, pendingBytes int64, uncachedBytes int) Features {
	q := float64(max(load, 0))
	return Features{1, q, float64(max(pendingBytes, 0)) / 1024, float64(max(uncachedBytes, 0)) / 1024,
		max(0, q-Knots[0]), max(0, q-Knots[1]), max(0, q-Knots[2]), max(0, q-Knots[3])}
}

// Coef are a model's coefficients in milliseconds per feature unit.
type Coef [N]float64

// DefaultCoef: 20 ms of fixed overhead, 5 ms per request ahead, 2 ms per
// KiB of prefill queued ahead (shared with the running batch), 10 ms per
// uncached KiB (~0.04 ms per token, a mid-size model's prefill on one
// GPU), no bend. Completions replace them within tens of requests per
// replica.
var DefaultCoef = Coef{20, 5, 2, 10, 0, 0, 0, 0}

// featureScale is each feature's typical magnitude; the ridge on a
// coefficient is Ridge times its square, so it is felt alike in every
// direction.
var featureScale = [N]float64{1, 8, 256, 16, 8, 8, 8, 8}

// Config tunes the learning.
type Config struct {
	// Alpha is the weight of a new observation (1/Alpha: the memory in
	// completions).
	Alpha float64
	// Ridge pulls coefficients towards the prior where the data do not
	// say otherwise (a replica that never queued keeps the prior's queue cost).
	Ridge float64
}

// DefaultConfig remembers about the last 64 completions of a replica.
func DefaultConfig() Config { return Config{Alpha: 1.0 / 64, Ridge: 0.002} }

// Model is one replica's (or one pool's) TTFT model. The zero value is not
// usable; use New.
type Model struct {
	cfg Config
	mu  sync.Mutex
	sxx [N][N]float64 // EW mean of x xᵀ
	sxy [N]float64    // EW mean of x y
	n   uint64
	w   [N]atomic.Uint64 // coefficient bits, published after each fit
}

// New returns a model predicting with prior until it has learned.
func New(cfg Config, prior Coef) *Model {
	m := &Model{cfg: cfg}
	m.publish(prior)
	return m
}

func (m *Model) publish(c Coef) {
	for i := range c {
		m.w[i].Store(math.Float64bits(c[i]))
	}
}

// Coef returns the current coefficients.
func (m *Model) Coef() Coef {
	var c Coef
	for i := range c {
		c[i] = math.Float64frombits(m.w[i].Load())
	}
	return c
}

// Predict returns the predicted TTFT in milliseconds (never below 0).
func (m *Model) Predict(x *Features) float64 {
	var y float64
	for i := range x {
		y += math.Float64frombits(m.w[i].Load()) * x[i]
	}
	return max(y, 0)
}

// Observed returns how many observations the model learned from.
func (m *Model) Observed() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// Observe learns one completion: features x at decision time, observed
// TTFT y in milliseconds; prior is where the ridge pulls (a pool-wide
// model's coefficients, or the defaults).
func (m *Model) Observe(x *Features, y float64, prior *Coef) {
	if math.IsNaN(y) || y < 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	// Bias-corrected start: the first observations are averaged plainly.
	a := max(m.cfg.Alpha, 1/float64(m.n))
	for i := range N {
		for j := range N {
			m.sxx[i][j] += a * (x[i]*x[j] - m.sxx[i][j])
		}
		m.sxy[i] += a * (x[i]*y - m.sxy[i])
	}
	// Solve (Sxx + R) w = Sxy + R prior. The ridge is scaled by the
	// effective sample size: few observations lean on the prior more.
	eff := min(float64(m.n)*m.cfg.Alpha, 1)
	var A [N][N]float64
	var b [N]float64
	for i := range N {
		r := m.cfg.Ridge * featureScale[i] * featureScale[i] / eff
		A[i] = m.sxx[i]
		A[i][i] += r
		b[i] = m.sxy[i] + r*prior[i]
	}
	if w, ok := solve(&A, &b); ok {
		// More load, queued prefill or uncached prompt never makes the
		// first token come sooner: a negative slope (collinear features
		// trading off) would draw requests to the busiest replica.
		for i := 1; i < N; i++ {
			w[i] = max(w[i], 0)
		}
		m.publish(w)
	}
}

// solve solves A w = b by Gaussian elimination with partial pivoting
// (A is symmetric positive definite with the ridge; ok is false if not).
func solve(A *[N][N]float64, b *[N]float64) (w Coef, ok bool) {
	for c := range N {
		p := c
		for r := c + 1; r < N; r++ {
			if math.Abs(A[r][c]) > math.Abs(A[p][c]) {
				p = r
			}
		}
		if math.Abs(A[p][c]) < 1e-12 {
			return w, false
		}
		A[c], A[p] = A[p], A[c]
		b[c], b[p] = b[p], b[c]
		for r := c + 1; r < N; r++ {
			f := A[r][c] / A[c][c]
			for k := c; k < N; k++ {
				A[r][k] -= f * A[c][k]
			}
			b[r] -= f * b[c]
		}
	}
	for c := N - 1; c >= 0; c-- {
		s := b[c]
		for k := c + 1; k < N; k++ {
			s -= A[c][k] * w[k]
		}
		w[c] = s / A[c][c]
		if math.IsNaN(w[c]) || math.IsInf(w[c], 0) {
			return w, false
		}
	}
	return w, true
}

// ErrorBuckets are the bounds of the relative prediction error histogram
// (|predicted - observed| / observed).
var ErrorBuckets = [...]float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5}

// AbsErrorBucketsMs are the bounds of the absolute prediction error
// histogram (|predicted - observed|, ms).
var AbsErrorBucketsMs = [...]float64{5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}

// ErrorHistogram counts relative prediction errors; safe for concurrent use.
type ErrorHistogram struct {
	Counts [len(ErrorBuckets) + 1]atomic.Uint64
	// SumMicros is the sum of the errors in millionths.
	SumMicros atomic.Uint64
}

// Observe adds one prediction's error (observed below 1 ms counts as 1 ms).
func (h *ErrorHistogram) Observe(predicted, observed float64) {
	v := math.Abs(predicted-observed) / max(observed, 1)
	add(h.Counts[:], ErrorBuckets[:], v)
	h.SumMicros.Add(uint64(min(v*1e6, 1e15)))
}

// Median is the median relative error, interpolated within its bucket
// (NaN before any observation; the last bucket's lower bound if it falls
// beyond the last bound).
func (h *ErrorHistogram) Median() float64 {
	var counts [len(ErrorBuckets) + 1]uint64
	return median(h.Counts[:], counts[:], ErrorBuckets[:])
}

// AbsErrorHistogram counts absolute prediction errors in ms; safe for
// concurrent use.
type AbsErrorHistogram struct {
	Counts [len(AbsErrorBucketsMs) + 1]atomic.Uint64
	// SumMicros is the sum of the errors in µs.
	SumMicros atomic.Uint64
}

// Observe adds one prediction's error.
func (h *AbsErrorHistogram) Observe(predicted, observed float64) {
	v := math.Abs(predicted - observed)
	add(h.Counts[:], AbsErrorBucketsMs[:], v)
	h.SumMicros.Add(uint64(min(v*1e3, 1e15)))
}

// Median is the median absolute error in ms, as ErrorHistogram's.
func (h *AbsErrorHistogram) Median() float64 {
	var counts [len(AbsErrorBucketsMs) + 1]uint64
	return median(h.Counts[:], counts[:], AbsErrorBucketsMs[:])
}

// Source is what a model learned an observation from.
type Source uint8

const (
	// FirstToken: one request's time to its first response body bytes,
	// timed by the proxy (the feedback line's tft=, /internal/done?tft=).
	FirstToken Source = iota
	// EngineMean: an engine's mean time to first token over a scrape
	// interval (vllm:time_to_first_token_seconds), against the mean
	// features of the decisions sent there in it.
	EngineMean
	// NumSources counts the sources.
	NumSources
)

var sourceNames = [NumSources]string{"first_token", "engine"}

// String is the source's metric label.
func (s Source) String() string { return sourceNames[s] }

// Errors are a model's prediction errors, absolute and relative, by what
// it learned from; safe for concurrent use.
type Errors struct {
	Rel [NumSources]ErrorHistogram
	Abs [NumSources]AbsErrorHistogram
}

// Observe adds one prediction's error against an observation from src.
func (e *Errors) Observe(src Source, predicted, observed float64) {
	e.Rel[src].Observe(predicted, observed)
	e.Abs[src].Observe(predicted, observed)
}

// Count is how many errors from src were observed.
func (e *Errors) Count(src Source) uint64 {
	var n uint64
	for i := range e.Abs[src].Counts {
		n += e.Abs[src].Counts[i].Load()
	}
	return n
}

func add(counts []atomic.Uint64, bounds []float64, v float64) {
	i := 0
	for i < len(bounds) && v > bounds[i] {
		i++
	}
	counts[i].Add(1)
}

// median reads the atomic counts into buf and interpolates the median
// within its bucket.
func median(src []atomic.Uint64, counts []uint64, bounds []float64) float64 {
	var total uint64
	for i := range src {
		counts[i] = src[i].Load()
		total += counts[i]
	}
	if total == 0 {
		return math.NaN()
	}
	half := float64(total) / 2
	var cum float64
	for i, c := range counts {
		if cum+float64(c) >= half {
			if i == len(bounds) {
				return bounds[i-1]
			}
			lo := 0.0
			if i > 0 {
				lo = bounds[i-1]
			}
			return lo + (bounds[i]-lo)*(half-cum)/float64(c)
		}
		cum += float64(c)
	}
	return bounds[len(bounds)-1]
}

// EWMean is an exponentially weighted mean (the first observation starts
// it); reading is one atomic load, safe for concurrent use.
type EWMean struct {
	mu   sync.Mutex
	v    float64
	n    uint64
	bits atomic.Uint64
}

// Observe adds x with weight alpha (at least 1/n while n is small: a plain
// mean at the start).
func (m *EWMean) Observe(x, alpha float64) {
	if math.IsNaN(x) {
		return
	}
	m.mu.Lock()
	m.n++
	m.v += max(alpha, 1/float64(m.n)) * (x - m.v)
	m.bits.Store(math.Float64bits(m.v))
	m.mu.Unlock()
}

// Load returns the mean (0 before any observation).
func (m *EWMean) Load() float64 { return math.Float64frombits(m.bits.Load()) }
