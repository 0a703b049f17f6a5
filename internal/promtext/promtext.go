// Package promtext holds the two pieces of the Prometheus text format that
// every hand-written /metrics writer in turnout repeats: a family's
// # HELP/# TYPE header and the bucket a histogram counts a value in.
package promtext

import (
	"fmt"
	"strings"
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
