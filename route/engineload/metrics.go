package engineload

import (
	"fmt"
	"strings"

	"github.com/turnout/turnout/internal/promtext"
	"github.com/turnout/turnout/route/fleet"
)

// WriteMetrics renders the scraper's counters and each endpoint's load
// figures (register with route.Decider.AddMetrics).
func (s *Scraper) WriteMetrics(b *strings.Builder) {
	snap := s.srv.Snapshot()
	s.mu.Lock()
	targets := make(map[string]*target, len(s.eps))
	for n, t := range s.eps {
		targets[n] = t
	}
	s.mu.Unlock()
	// Every endpoint with its labels and its engine figures as read now,
	// in snapshot order (t: nil when not scraped). Each family below lists
	// them once: the text format keeps a family's samples together.
	type row struct {
		labels string
		t      *target
		e      *fleet.Endpoint
		engine *fleet.EngineLoad
	}
	var rows []row
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			rows = append(rows, row{fmt.Sprintf("deployment=%q,pool=%q,endpoint=%q", p.Deployment, p.Name, e.Name), targets[e.Name], e, e.Engine()})
		}
	}
	help := promtext.Helper(b)
	help("turnout_engine_scrapes_total", "counter", "Scrapes of endpoints' own /metrics (engine load), by result.")
	for _, r := range rows {
		for res := Result(0); r.t != nil && res < numResults; res++ {
			fmt.Fprintf(b, "turnout_engine_scrapes_total{%s,result=%q} %d\n", r.labels, res.String(), r.t.results[res].Load())
		}
	}
	for _, c := range []struct {
		name, help string
		value      func(*target) any // a count, or seconds
	}{
		{"turnout_engine_scrapes_idle_skipped_total", "Scrape rounds that left an idle endpoint unscraped (engine_metrics.idle_interval backoff).",
			func(t *target) any { return t.skipped.Load() }},
		{"turnout_engine_figures_shared_total", "Engine figures applied from the replica's owner, another cluster instance (engine_metrics.share), in place of a scrape.",
			func(t *target) any { return t.shared.Load() }},
		{"turnout_engine_scrapes_fallback_total", "Scrape rounds of a replica another cluster instance owns, because its shared figures were missing or stale.",
			func(t *target) any { return t.fallback.Load() }},
		{"turnout_engine_scrapes_refetched_total", "Scrapes fetched twice because a completion arrived while the first page was in flight (was it still running in the page?).",
			func(t *target) any { return t.refetched.Load() }},
		{"turnout_engine_scrape_seconds_total", "Time spent scraping endpoints' /metrics.",
			func(t *target) any { return float64(t.durNs.Load()) / 1e9 }},
		{"turnout_engine_scrape_bytes_total", "Body bytes read from endpoints' /metrics.",
			func(t *target) any { return t.bytes.Load() }},
	} {
		help(c.name, "counter", c.help)
		for _, r := range rows {
			if r.t != nil {
				fmt.Fprintf(b, "%s{%s} %v\n", c.name, r.labels, c.value(r.t))
			}
		}
	}
	help("turnout_endpoint_engine_requests", "gauge", "Running + waiting requests the engine reported at the last scrape (absent: no figure, in-flight counts are used).")
	for _, r := range rows {
		if r.engine != nil {
			fmt.Fprintf(b, "turnout_endpoint_engine_requests{%s} %d\n", r.labels, r.engine.Requests)
		}
	}
	help("turnout_endpoint_engine_kv_usage_ratio", "gauge", "KV-cache usage the engine reported at the last scrape, 0..1; 0 without a figure (engine_metrics off, no scrape yet: see turnout_engine_scrapes_total).")
	for _, r := range rows {
		kvUsage := 0.0
		if r.engine != nil {
			kvUsage = max(r.engine.KVUsage, 0)
		}
		fmt.Fprintf(b, "turnout_endpoint_engine_kv_usage_ratio{%s} %g\n", r.labels, kvUsage)
	}
	help("turnout_endpoint_load", "gauge", "The load figure policies balance on: engine requests + decisions since the scrape, or in-flight decisions.")
	for _, r := range rows {
		fmt.Fprintf(b, "turnout_endpoint_load{%s} %d\n", r.labels, r.e.Load())
	}
}
