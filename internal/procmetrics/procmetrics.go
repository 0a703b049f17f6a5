// Package procmetrics renders the metrics every Prometheus user looks for
// first: turnout_build_info and the Go runtime (go_*) and process
// (process_*) collectors of prometheus/client_golang. They are gathered
// only when /metrics is scraped, never on the decision path.
package procmetrics

import (
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
)

// Writer appends the metrics to a /metrics page. Safe for concurrent scrapes.
type Writer struct {
	reg *prometheus.Registry
	mu  sync.Mutex // one gather at a time: scrapes are rare, gathers allocate
}

// New registers build info (version, Go version) and the Go and process
// collectors on a private registry (no global state).
func New(version string) (*Writer, error) {
	reg := prometheus.NewRegistry()
	bi := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "turnout_build_info",
		Help:        "Always 1; the labels say which turnout build is running.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	bi.Set(1)
	for _, c := range []prometheus.Collector{
		bi,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("procmetrics: %w", err)
		}
	}
	return &Writer{reg: reg}, nil
}

// WriteMetrics appends the Prometheus text format to b.
func (w *Writer) WriteMetrics(b *strings.Builder) {
	w.mu.Lock()
	defer w.mu.Unlock()
	mfs, err := w.reg.Gather()
	if err != nil {
		// A partial gather still has the families that worked; say what failed.
		fmt.Fprintf(b, "# procmetrics: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
	}
	enc := expfmt.NewEncoder(b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			fmt.Fprintf(b, "# procmetrics: %s\n", err)
			return
		}
	}
}
