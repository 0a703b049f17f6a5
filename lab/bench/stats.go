package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0..100) of sorted values by linear
// interpolation between the closest ranks (numpy's default), or NaN for no
// values. Interpolating keeps p99 of a small run from jumping to the max.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	pos := p / 100 * float64(n-1)
	lo := int(pos)
	frac := pos - float64(lo)
	if lo+1 >= n {
		return sorted[n-1]
	}
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// Summary holds percentiles of one sample in the sample's unit.
type Summary struct {
	N             int
	Mean          float64
	P50, P90, P99 float64
	Max           float64
}

// Summarize sorts a copy of xs and returns its percentiles.
func Summarize(xs []float64) Summary {
	s := slices.Clone(xs)
	slices.Sort(s)
	out := Summary{N: len(s), P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99), Mean: math.NaN(), Max: math.NaN()}
	if len(s) > 0 {
		sum := 0.0
		for _, x := range s {
			sum += x
		}
		out.Mean = sum / float64(len(s))
		out.Max = s[len(s)-1]
	}
	return out
}

// Millis converts durations to float milliseconds for Summarize.
func Millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// MaxOverMean is the load imbalance of per-replica loads: 1 is perfectly
// even, N means one replica of N got everything. It is 0 when there is no
// load at all.
func MaxOverMean(loads []float64) float64 {
	if len(loads) == 0 {
		return 0
	}
	sum, mx := 0.0, math.Inf(-1)
	for _, l := range loads {
		sum += l
		mx = max(mx, l)
	}
	if sum <= 0 {
		return 0
	}
	return mx / (sum / float64(len(loads)))
}

// Ratio is a/b, or 0 when b is 0, for hit ratios of empty runs.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
