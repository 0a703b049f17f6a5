package flow

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/promtext"
)

// waitBuckets are the hold-time histogram's bounds in seconds.
var waitBuckets = [...]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// Tenant labels past max_tenant_labels, and requests without a tenant.
const (
	labelOther = "other"
	labelNone  = "none"
)

// metrics are one controller's counters: per class and tenant label the
// requests held now and each outcome, per class the hold times. Tenant
// labels are bounded: the first max_tenant_labels tenants seen get their
// own, later ones share "other".
type metrics struct {
	classes []string
	mu      sync.Mutex
	byKey   map[uint64]*tenantStats
	order   []*tenantStats // label order of first sight
	other   *tenantStats
	max     int
	wait    []waitHist
}

type tenantStats struct {
	label    string
	queued   []atomic.Int64
	outcomes [][numOutcomes]atomic.Uint64
}

type waitHist struct {
	counts [len(waitBuckets) + 1]atomic.Uint64
	sumNs  atomic.Uint64
}

func newMetrics(cfg *config.FlowConfig) *metrics {
	m := &metrics{byKey: map[uint64]*tenantStats{}, max: cfg.MaxTenantLabels, wait: make([]waitHist, len(cfg.Classes))}
	for i := range cfg.Classes {
		m.classes = append(m.classes, cfg.Classes[i].Name)
	}
	m.other = m.newStats(labelOther)
	return m
}

func (m *metrics) newStats(label string) *tenantStats {
	return &tenantStats{label: label, queued: make([]atomic.Int64, len(m.classes)), outcomes: make([][numOutcomes]atomic.Uint64, len(m.classes))}
}

// stats finds r's tenant's counters, giving it a label while there is one.
func (m *metrics) stats(r *Request) *tenantStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.byKey[r.Tenant]; s != nil {
		return s
	}
	if len(m.byKey) >= m.max {
		return m.other
	}
	var label string
	switch {
	case r.kind == tenantNone:
		label = labelNone
	default:
		label = cleanLabel(r.TenantName)
	}
	s := m.newStats(label)
	m.byKey[r.Tenant] = s
	m.order = append(m.order, s)
	return s
}

func (m *metrics) count(r *Request, o Outcome) { m.stats(r).outcomes[r.Class][o].Add(1) }

func (m *metrics) queued(r *Request, d int64) { m.stats(r).queued[r.Class].Add(d) }

func (m *metrics) waited(class int, d time.Duration) {
	h := &m.wait[class]
	h.counts[promtext.Bucket(waitBuckets[:], d.Seconds())].Add(1)
	h.sumNs.Add(uint64(d))
}

// Released is how many requests of class (by name) tenant label were let
// through after being held (tests, benchmarks).
func (c *Controller) Released(class, tenant string) uint64 {
	return c.m.total(class, tenant, Released)
}

// Count is how many requests of class and tenant label had outcome o.
func (c *Controller) Count(class, tenant string, o Outcome) uint64 {
	return c.m.total(class, tenant, o)
}

func (m *metrics) total(class, tenant string, o Outcome) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := append([]*tenantStats{m.other}, m.order...)
	for ci, name := range m.classes {
		if name != class {
			continue
		}
		for _, s := range all {
			if s.label == tenant {
				return s.outcomes[ci][o].Load()
			}
		}
	}
	return 0
}

// families are the flow metrics, in the order writeMetrics fills them.
var families = [...][3]string{
	{"turnout_flow_queued", "gauge", "Requests held by flow control now, by class and tenant (tenants past max_tenant_labels are \"other\")."},
	{"turnout_flow_requests_total", "counter", "Flow control outcomes by class and tenant: admitted at once, released after a hold, overflow (queue full, routed), timed_out (held max_wait, routed), shed (429), gone (client left while held)."},
	{"turnout_flow_wait_seconds", "histogram", "Time requests were held by flow control before release or timeout, by class."},
	{"turnout_flow_saturated", "gauge", "1 while the deployment's serving pool has no room under the flow control thresholds."},
}

// writeMetrics renders the controller's metrics for deployment dep, one
// builder per family (a family's lines must be contiguous on the page).
func (c *Controller) writeMetrics(fam *[len(families)]strings.Builder, dep string) {
	m := c.m
	m.mu.Lock()
	all := append(append([]*tenantStats(nil), m.order...), m.other)
	m.mu.Unlock()
	for ci, cl := range m.classes {
		for _, s := range all {
			fmt.Fprintf(&fam[0], "turnout_flow_queued{deployment=%q,class=%q,tenant=%q} %d\n", dep, cl, s.label, s.queued[ci].Load())
			for o := Outcome(0); o < numOutcomes; o++ {
				fmt.Fprintf(&fam[1], "turnout_flow_requests_total{deployment=%q,class=%q,tenant=%q,outcome=%q} %d\n", dep, cl, s.label, o, s.outcomes[ci][o].Load())
			}
		}
		h := &m.wait[ci]
		promtext.Histogram(&fam[2], "turnout_flow_wait_seconds", fmt.Sprintf("deployment=%q,class=%q", dep, cl),
			waitBuckets[:], 1, h.counts[:], float64(h.sumNs.Load())/1e9)
	}
	sat := 0
	if c.Saturated() {
		sat = 1
	}
	fmt.Fprintf(&fam[3], "turnout_flow_saturated{deployment=%q} %d\n", dep, sat)
}

// cleanLabel keeps a client-chosen tenant name to characters a Prometheus
// label value and a log line carry as they are; others become '_'.
func cleanLabel(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.IndexByte("-_.:@/", c) >= 0:
			out[i] = c
		default:
			out[i] = '_'
		}
	}
	return string(out)
}
