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

// Group writes the sample lines in lines (several writers' output, one
// family's samples possibly spread among others') to b family by family,
// in the order of fams ({name, type, help} each), each under its # HELP and
// # TYPE lines: a family's lines must be contiguous on the page and follow
// its header. A family of fams with no line is left out; lines of a family
// not in fams follow, in their order, without a header.
func Group(b *strings.Builder, lines string, fams [][3]string) {
	if lines == "" {
		return
	}
	ls := strings.Split(strings.TrimSuffix(lines, "\n"), "\n")
	used := make([]bool, len(ls))
	for _, f := range fams {
		header := false
		for i, l := range ls {
			if used[i] || !familyOf(l, f[0], f[1]) {
				continue
			}
			if !header {
				fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", f[0], f[2], f[0], f[1])
				header = true
			}
			b.WriteString(l)
			b.WriteByte('\n')
			used[i] = true
		}
	}
	for i, l := range ls {
		if !used[i] {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
}

// familyOf reports whether sample line l belongs to family name of type
// typ (a histogram's or summary's _bucket, _sum and _count series too).
func familyOf(l, name, typ string) bool {
	s, ok := strings.CutPrefix(l, name)
	if !ok {
		return false
	}
	if typ == "histogram" || typ == "summary" {
		for _, suf := range [...]string{"_bucket", "_sum", "_count"} {
			if t, ok := strings.CutPrefix(s, suf); ok {
				s = t
				break
			}
		}
	}
	return s != "" && (s[0] == '{' || s[0] == ' ')
}
