package route

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The whole /metrics page of a fleet with every policy that writes metrics
// of its own, twice, parses as the Prometheus text format, and every
// family has its # HELP and # TYPE, with its lines contiguous.
func TestMetricsPageFamilies(t *testing.T) {
	s := mustServer(t, `
health: {disable: true}
deployments:
  - name: kv
    models: [kv]
    policy: {name: kv-aware}
    pools:
      - role: mixed
        endpoints: [{name: a, address: 127.0.0.1:8001}, {name: b, address: 127.0.0.1:8002}]
  - name: kv2
    models: [kv2]
    policy: {name: kv-aware}
    pools:
      - role: mixed
        endpoints: [{name: c, address: 127.0.0.1:8003}]
  - name: pt
    models: [pt]
    policy: {name: predicted-ttft}
    pools:
      - role: mixed
        endpoints: [{name: d, address: 127.0.0.1:8004}]
  - name: rr
    models: [rr]
    policy: {name: round-robin}
    pools:
      - role: mixed
        endpoints: [{name: e, address: 127.0.0.1:8005}]
`)
	t.Cleanup(s.Close)
	var b strings.Builder
	s.WriteMetrics(&b)
	page := b.String()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatalf("page does not parse: %v", err)
	}
	for _, name := range []string{"turnout_kv_index_blocks", "turnout_kv_events_total", "turnout_ttft_overrides_total"} {
		if fams[name] == nil {
			t.Errorf("family %s missing from the page", name)
		}
	}
	for name, f := range fams {
		if f.GetHelp() == "" {
			t.Errorf("family %s has no # HELP", name)
		}
		if !strings.Contains(page, "# TYPE "+name+" ") {
			t.Errorf("family %s has no # TYPE", name)
		}
	}
	// Contiguity: once another family's line follows, a family never
	// comes back.
	done := map[string]bool{}
	last := ""
	for _, l := range strings.Split(page, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name := familyName(l, fams)
		if name != last {
			if done[name] {
				t.Errorf("family %s's lines are not contiguous (again at %q)", name, l)
			}
			done[last] = true
			last = name
		}
	}
}

// familyName is the family of sample line l: its metric name, less a
// histogram's or summary's series suffix when that names a known family.
func familyName(l string, fams map[string]*dto.MetricFamily) string {
	n := l[:strings.IndexAny(l, "{ ")]
	if fams[n] != nil {
		return n
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(n, suf); ok && fams[base] != nil {
			return base
		}
	}
	return n
}
