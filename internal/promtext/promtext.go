// Package promtext holds the pieces of the Prometheus text format that
// every hand-written /metrics writer in turnout repeats: a family's
// # HELP/# TYPE header, the bucket a histogram counts a value in, and a
// histogram series' lines.
package promtext

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
)

// Helper returns a function that writes a metric family's # HELP and
// # TYPE lines to b.
func Helper(b *strings.Builder) func(name, typ, text string) {
	return func(name, typ, text string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, typ)
	}
}

// Bucket is the index of the first upper bound v does not exceed among the
// ascending bounds, len(bounds) (the +Inf bucket) when it exceeds them all.
func Bucket(bounds []float64, v float64) int {
	i := 0
	for i < len(bounds) && v > bounds[i] {
		i++
	}
	return i
}

// Histogram writes one series of histogram family name: its cumulative
// buckets (counts[i] counts the values up to bounds[i], scaled by scale
// into the family's unit; the last count, the values above them all, is
// +Inf), then its sum and count. labels are the series' labels without
// braces.
func Histogram(b *strings.Builder, name, labels string, bounds []float64, scale float64, counts []atomic.Uint64, sum float64) {
	var cum uint64
	for i := range counts {
		cum += counts[i].Load()
		le := "+Inf"
		if i < len(bounds) {
			le = strconv.FormatFloat(bounds[i]*scale, 'g', -1, 64)
		}
		fmt.Fprintf(b, "%s_bucket{%s,le=%q} %d\n", name, labels, le, cum)
	}
	fmt.Fprintf(b, "%s_sum{%s} %g\n", name, labels, sum)
	fmt.Fprintf(b, "%s_count{%s} %d\n", name, labels, cum)
}
