package bench

import (
	"fmt"
	"math"
	"testing"
)

// HistMedian interpolates within the median's bucket over the series of
// one label value, as histogram_quantile does, and ignores other series.
func TestHistMedian(t *testing.T) {
	text := `# TYPE x histogram
x_bucket{pool="a",source="first_token",le="0.1"} 2
x_bucket{pool="a",source="first_token",le="0.5"} 6
x_bucket{pool="a",source="first_token",le="+Inf"} 8
x_bucket{pool="a",source="engine",le="0.1"} 100
x_bucket{pool="a",source="engine",le="0.5"} 100
x_bucket{pool="a",source="engine",le="+Inf"} 100
`
	// 8 samples: the 4th is half-way through the (0.1, 0.5] bucket's 4.
	med, n := HistMedian(ParseProm(text), "x", "source", "first_token")
	if n != 8 || math.Abs(med-0.3) > 1e-9 {
		t.Fatalf("median %v of %v samples, want 0.3 of 8", med, n)
	}
	if med, n := HistMedian(ParseProm(text), "x", "source", "none"); n != 0 || !math.IsNaN(med) {
		t.Fatalf("no series: median %v of %v, want NaN of 0", med, n)
	}
}

// The difference of two readings is the run's: its quantiles interpolate
// in its own buckets, and the share over a bucket bound is exact while a
// bound that is not a bucket's is refused.
func TestBucketsMinusQuantileOver(t *testing.T) {
	read := func(b1, b2, inf int) Buckets {
		text := fmt.Sprintf(`d_bucket{pool="a",le="5e-05"} %d
d_bucket{pool="a",le="0.0001"} %d
d_bucket{pool="a",le="+Inf"} %d
d_bucket{pool="b",le="5e-05"} 1
d_bucket{pool="b",le="0.0001"} 1
d_bucket{pool="b",le="+Inf"} 1
`, b1, b2, inf)
		return HistBuckets(ParseProm(text), "d", "", "")
	}
	run := read(110, 205, 210).Minus(read(10, 5, 10))
	// 200 in the run: 100 up to 50 µs, 100 more up to 100 µs, none above.
	if n := run.Count(); n != 200 {
		t.Fatalf("count %v, want 200", n)
	}
	if p50, _ := run.Quantile(0.5); math.Abs(p50-50e-6) > 1e-12 {
		t.Errorf("p50 %v, want 5e-05", p50)
	}
	if p99, _ := run.Quantile(0.99); math.Abs(p99-99e-6) > 1e-12 {
		t.Errorf("p99 %v, want 9.9e-05 (interpolated in (50, 100] µs)", p99)
	}
	if over, ok := run.Over(50e-6); !ok || over != 0.5 {
		t.Errorf("over 50 µs %v %v, want 0.5", over, ok)
	}
	if _, ok := run.Over(75e-6); ok {
		t.Error("a bound between buckets must not resolve")
	}
}
