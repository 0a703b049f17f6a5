package promtext

import (
	"strings"
	"sync/atomic"
	"testing"
)

func TestHelper(t *testing.T) {
	var b strings.Builder
	help := Helper(&b)
	help("x_total", "counter", "Things.")
	help("y", "gauge", "Level.")
	want := "# HELP x_total Things.\n# TYPE x_total counter\n# HELP y Level.\n# TYPE y gauge\n"
	if b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
}

func TestBucket(t *testing.T) {
	bounds := []float64{0.1, 1, 10}
	for _, c := range []struct {
		v    float64
		want int
	}{{-1, 0}, {0.1, 0}, {0.11, 1}, {1, 1}, {5, 2}, {10, 2}, {10.5, 3}, {1e9, 3}} {
		if got := Bucket(bounds, c.v); got != c.want {
			t.Errorf("Bucket(%v) = %d, want %d", c.v, got, c.want)
		}
	}
	if got := Bucket(nil, 1); got != 0 {
		t.Errorf("Bucket with no bounds = %d, want 0", got)
	}
}

func TestHistogram(t *testing.T) {
	var counts [3]atomic.Uint64
	counts[0].Store(2)
	counts[2].Store(1)
	var b strings.Builder
	Histogram(&b, "x_seconds", `pool="a"`, []float64{5, 50}, 1e-3, counts[:], 0.25)
	want := `x_seconds_bucket{pool="a",le="0.005"} 2
x_seconds_bucket{pool="a",le="0.05"} 2
x_seconds_bucket{pool="a",le="+Inf"} 3
x_seconds_sum{pool="a"} 0.25
x_seconds_count{pool="a"} 3
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// Group gathers each family's lines under one header, in the table's
// order, whatever order the writers put them in; a family whose name is a
// prefix of another's keeps only its own lines, and unknown lines follow.
func TestGroup(t *testing.T) {
	lines := `a_total{p="1"} 1
a_total_extra{p="1"} 7
h_seconds_bucket{p="1",le="+Inf"} 2
b{p="1"} 2
a_total{p="2"} 3
h_seconds_sum{p="1"} 0.5
h_seconds_count{p="1"} 2
b 4
`
	fams := [][3]string{
		{"b", "gauge", "B."},
		{"a_total", "counter", "A."},
		{"h_seconds", "histogram", "H."},
		{"none", "gauge", "Not on the page."},
	}
	var b strings.Builder
	Group(&b, lines, fams)
	want := `# HELP b B.
# TYPE b gauge
b{p="1"} 2
b 4
# HELP a_total A.
# TYPE a_total counter
a_total{p="1"} 1
a_total{p="2"} 3
# HELP h_seconds H.
# TYPE h_seconds histogram
h_seconds_bucket{p="1",le="+Inf"} 2
h_seconds_sum{p="1"} 0.5
h_seconds_count{p="1"} 2
a_total_extra{p="1"} 7
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	Group(&b, "", fams)
	if b.Len() != 0 {
		t.Fatalf("no lines gave %q", b.String())
	}
}
