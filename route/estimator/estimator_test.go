package estimator

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The model learns a known TTFT curve from noisy observations, starting
// from the defaults: its predictions match and the dominant costs (per
// uncached KiB, per request queued beyond 8) are recovered.
func TestModelLearnsCoefficients(t *testing.T) {
	truth := Coef{30, 2, 0.5, 12, 0, 40, 0, 0}
	m := New(DefaultConfig(), DefaultCoef)
	rng := rand.New(rand.NewPCG(1, 2))
	var relErr ErrorHistogram
	for i := range 4000 {
		x := Make(int64(rng.IntN(24)), int64(rng.IntN(64<<10)), rng.IntN(16<<10))
		var y float64
		for k := range x {
			y += truth[k] * x[k]
		}
		y *= 1 + 0.05*rng.NormFloat64()
		if i >= 3000 {
			relErr.Observe(m.Predict(&x), y)
		}
		m.Observe(&x, y, &DefaultCoef)
	}
	if med := relErr.Median(); !(med < 0.06) {
		t.Errorf("median relative error %.3f after learning, want < 0.06 (noise 5%%)", med)
	}
	got := m.Coef()
	if math.Abs(got[3]-truth[3]) > 1 {
		t.Errorf("per KiB %.2f, want about %.0f (all %.2f)", got[3], truth[3], got)
	}
	// The bend: 8 requests more beyond 8 cost about 8*(2+40) ms more.
	lo, hi := Make(8, 0, 0), Make(16, 0, 0)
	if d := m.Predict(&hi) - m.Predict(&lo); math.Abs(d-8*42) > 40 {
		t.Errorf("8 more requests past the bend cost %.0f ms, want about %d (all %.2f)", d, 8*42, got)
	}
}

// Without variation in a feature, its coefficient stays at the prior: a
// replica that never queued keeps the prior's cost of a queue.
func TestModelKeepsPriorWhereUnexcited(t *testing.T) {
	m := New(DefaultConfig(), DefaultCoef)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		x := Make(0, 0, rng.IntN(8<<10))
		y := 25 + 11*x[3]
		m.Observe(&x, y, &DefaultCoef)
	}
	got := m.Coef()
	if math.Abs(got[1]-DefaultCoef[1]) > 0.5 || math.Abs(got[3]-11) > 1 {
		t.Fatalf("coefficients %.2f: want the queue term near the prior %.1f and 11 ms/KiB", got, DefaultCoef[1])
	}
	// Bad observations are ignored.
	x := Make(1, 1, 1)
	m.Observe(&x, math.NaN(), &DefaultCoef)
	m.Observe(&x, -5, &DefaultCoef)
	if m.Observed() != 2000 {
		t.Fatalf("observed %d, want 2000 (NaN and negative skipped)", m.Observed())
	}
}

func TestErrorHistogramMedian(t *testing.T) {
	var h ErrorHistogram
	if !math.IsNaN(h.Median()) {
		t.Fatal("median of nothing is not NaN")
	}
	for range 10 {
		h.Observe(100, 100) // 0
		h.Observe(125, 100) // 0.25
		h.Observe(300, 100) // 2.0
	}
	if med := h.Median(); med < 0.2 || med > 0.3 {
		t.Fatalf("median %.3f, want in the 0.2-0.3 bucket", med)
	}
}

func TestAbsErrorHistogramMedian(t *testing.T) {
	var h AbsErrorHistogram
	if !math.IsNaN(h.Median()) {
		t.Fatal("median of nothing is not NaN")
	}
	for range 10 {
		h.Observe(100, 100)   // 0 ms
		h.Observe(130, 100)   // 30 ms
		h.Observe(100, 20000) // 19,900 ms: beyond the last bound
	}
	if med := h.Median(); med < 25 || med > 50 {
		t.Fatalf("median %.1f ms, want in the 25-50 ms bucket", med)
	}
	for range 30 {
		h.Observe(0, 20000)
	}
	if med := h.Median(); med != AbsErrorBucketsMs[len(AbsErrorBucketsMs)-1] {
		t.Fatalf("median %.1f ms beyond the last bound, want the last bound", med)
	}
}

func TestPredictAllocs(t *testing.T) {
	m := New(DefaultConfig(), DefaultCoef)
	x := Make(3, 4096, 2048)
	if n := testing.AllocsPerRun(100, func() { _ = m.Predict(&x); m.Observe(&x, 50, &DefaultCoef) }); n != 0 {
		t.Fatalf("%v allocations per predict+observe", n)
	}
}

func BenchmarkPredict(b *testing.B) {
	m := New(DefaultConfig(), DefaultCoef)
	x := Make(3, 4096, 2048)
	for b.Loop() {
		_ = m.Predict(&x)
	}
}
