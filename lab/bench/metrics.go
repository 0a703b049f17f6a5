package bench

import (
	"bufio"
	"math"
	"slices"
	"strconv"
	"strings"
)

// PromSample is one line of Prometheus text exposition.
type PromSample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// ParseProm reads the samples of a Prometheus text exposition; comments and
// malformed lines are skipped (the bench only reads simple counters).
func ParseProm(text string) []PromSample {
	var out []PromSample
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		s := PromSample{Value: v, Labels: map[string]string{}}
		head := strings.TrimSpace(line[:sp])
		if i := strings.IndexByte(head, '{'); i >= 0 && strings.HasSuffix(head, "}") {
			s.Name = head[:i]
			for _, kv := range splitLabels(head[i+1 : len(head)-1]) {
				k, val, ok := strings.Cut(kv, "=")
				if !ok {
					continue
				}
				if uq, err := strconv.Unquote(val); err == nil {
					val = uq
				}
				s.Labels[strings.TrimSpace(k)] = val
			}
		} else {
			s.Name = head
		}
		out = append(out, s)
	}
	return out
}

// splitLabels splits k="v",k2="v2" on commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	inQ, esc, start := false, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case esc:
			esc = false
		case c == '\\':
			esc = true
		case c == '"':
			inQ = !inQ
		case c == ',' && !inQ:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// SumProm sums the samples named name.
func SumProm(samples []PromSample, name string) float64 {
	t := 0.0
	for _, s := range samples {
		if s.Name == name {
			t += s.Value
		}
	}
	return t
}

// DecisionDetail condenses turnout's /metrics into "affinity=N balanced=N
// overflow=N" (plus kv-aware's fallbacks): how often the policy followed
// the cache and how often the load guard overrode it.
func DecisionDetail(metricsText string) string {
	samples := ParseProm(metricsText)
	counts := map[string]float64{}
	for _, s := range samples {
		if s.Name == "turnout_decisions_total" {
			counts[s.Labels["outcome"]] += s.Value
		}
	}
	var parts []string
	for _, o := range []string{"affinity", "balanced", "overflow", "no_endpoint"} {
		if counts[o] > 0 {
			parts = append(parts, o+"="+strconv.FormatFloat(counts[o], 'f', 0, 64))
		}
	}
	if fb := SumProm(samples, "turnout_kv_fallbacks_total"); fb > 0 {
		parts = append(parts, "kv_fallbacks="+strconv.FormatFloat(fb, 'f', 0, 64))
	}
	// predicted-ttft's errors against the first tokens fed back, else
	// against the engines' interval means.
	for _, src := range []string{"first_token", "engine"} {
		rel, n := HistMedian(samples, "turnout_ttft_prediction_error_ratio", "source", src)
		if n == 0 {
			continue
		}
		abs, _ := HistMedian(samples, "turnout_ttft_prediction_error_seconds", "source", src)
		parts = append(parts, "ttft_pred_src="+src, "ttft_pred_n="+strconv.FormatFloat(n, 'f', 0, 64),
			"ttft_pred_err_p50="+strconv.FormatFloat(rel, 'f', 3, 64), "ttft_pred_abs_err_p50_ms="+strconv.FormatFloat(abs*1000, 'f', 0, 64))
		break
	}
	for _, s := range samples {
		if s.Name == "turnout_ttft_overrides_total" {
			parts = append(parts, "ttft_overrides="+strconv.FormatFloat(s.Value, 'f', 0, 64))
		}
	}
	return strings.Join(parts, " ")
}

// HistMedian is the median of the histogram family name over the series
// whose label key is val (buckets summed across the others), interpolated
// within its bucket as Prometheus' histogram_quantile does, and the count.
func HistMedian(samples []PromSample, name, key, val string) (median, count float64) {
	return HistBuckets(samples, name, key, val).Quantile(0.5)
}

// Buckets is a histogram's cumulative counts by upper bound (le).
type Buckets map[float64]float64

// HistBuckets sums the buckets of the histogram family name over the
// series whose label key is val ("" and "": every series).
func HistBuckets(samples []PromSample, name, key, val string) Buckets {
	cum := Buckets{}
	for _, s := range samples {
		if s.Name != name+"_bucket" || s.Labels[key] != val {
			continue
		}
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
		if err != nil {
			continue
		}
		cum[le] += s.Value
	}
	return cum
}

// Minus is b's counts less an earlier reading's of the same histogram:
// what it counted in between.
func (b Buckets) Minus(earlier Buckets) Buckets {
	out := make(Buckets, len(b))
	for le, c := range b {
		out[le] = c - earlier[le]
	}
	return out
}

// Count is how many observations b holds.
func (b Buckets) Count() float64 { return b[math.Inf(1)] }

// Quantile is the q-quantile (0-1) of b, interpolated within its bucket
// as Prometheus' histogram_quantile does (NaN when b is empty), and the
// count.
func (b Buckets) Quantile(q float64) (v, count float64) {
	les := make([]float64, 0, len(b))
	for le := range b {
		les = append(les, le)
	}
	slices.Sort(les)
	if len(les) == 0 || b[les[len(les)-1]] == 0 {
		return math.NaN(), 0
	}
	count = b[les[len(les)-1]]
	rank, lo, below := q*count, 0.0, 0.0
	for _, le := range les {
		if b[le] >= rank {
			if math.IsInf(le, 1) {
				return lo, count
			}
			return lo + (le-lo)*(rank-below)/(b[le]-below), count
		}
		lo, below = le, b[le]
	}
	return lo, count
}

// Over is the share of b's observations above bound, which must be one of
// its bucket bounds: false when b does not resolve it (or is empty).
func (b Buckets) Over(bound float64) (float64, bool) {
	at, ok := b[bound]
	n := b.Count()
	if !ok || n <= 0 {
		return 0, false
	}
	return (n - at) / n, true
}
