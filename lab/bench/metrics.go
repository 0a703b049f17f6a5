package bench

import (
	"bufio"
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
	for _, s := range samples {
		if s.Name == "turnout_ttft_prediction_error_median_ratio" {
			parts = append(parts, "ttft_pred_err_p50="+strconv.FormatFloat(s.Value, 'f', 3, 64))
		}
		if s.Name == "turnout_ttft_prediction_error_median_seconds" {
			parts = append(parts, "ttft_pred_abs_err_p50_ms="+strconv.FormatFloat(s.Value*1000, 'f', 0, 64))
		}
		if s.Name == "turnout_ttft_overrides_total" {
			parts = append(parts, "ttft_overrides="+strconv.FormatFloat(s.Value, 'f', 0, 64))
		}
	}
	return strings.Join(parts, " ")
}
