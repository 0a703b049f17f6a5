package bench

import (
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
