package bench

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	s := []float64{1, 2, 3, 4}
	for _, tc := range []struct {
		p, want float64
	}{
		{0, 1}, {50, 2.5}, {90, 3.7}, {100, 4}, {-5, 1}, {150, 4}, {25, 1.75},
	} {
		if got := Percentile(s, tc.p); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile([]float64{7}, 99); got != 7 {
		t.Errorf("single value p99 = %v", got)
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("no values must give NaN")
	}
}

func TestSummarize(t *testing.T) {
	xs := Millis([]time.Duration{40 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 20 * time.Millisecond})
	s := Summarize(xs)
	if s.N != 4 || s.P50 != 25 || s.Mean != 25 || s.Max != 40 || math.Abs(s.P99-39.7) > 1e-9 {
		t.Fatalf("summary %+v", s)
	}
	if xs[0] != 40 {
		t.Fatal("Summarize must not sort its input in place")
	}
}

func TestMaxOverMean(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loads []float64
		want  float64
	}{
		{"even", []float64{5, 5, 5, 5}, 1},
		{"one of three doubled", []float64{1, 1, 2}, 1.5},
		{"all on one of four", []float64{8, 0, 0, 0}, 4},
		{"no load", []float64{0, 0}, 0},
		{"no replicas", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MaxOverMean(tc.loads); math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	if Ratio(1, 0) != 0 || Ratio(1, 4) != 0.25 {
		t.Fatal("Ratio")
	}
}
