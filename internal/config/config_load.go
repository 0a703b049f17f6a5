package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// EngineMetricsConfig configures scraping each endpoint's own Prometheus page
// (vLLM /metrics: num_requests_running + num_requests_waiting, KV usage) so
// every turnout instance balances on what the engines report, not only on
// its own share of the traffic. On by default; a failing scrape falls back
// to in-flight counts for that endpoint.
type EngineMetricsConfig struct {
	Disable  bool     `yaml:"disable"`
	Path     string   `yaml:"path"`
	Interval Duration `yaml:"interval"`
	// IdleInterval is how often an idle replica is scraped: one whose
	// engine reported nothing running or waiting at the last scrape and
	// which got no request from this instance or its cluster peers since.
	// Its interval doubles from Interval up to IdleInterval and drops back
	// at the next decision for it. Idle scrapes at Interval would be most
	// of an idle instance's CPU. 0 = 2s; equal to Interval turns it off.
	IdleInterval Duration `yaml:"idle_interval"`
	// Timeout bounds one scrape (connect, headers and body).
	Timeout Duration `yaml:"timeout"`
	// MaxBytes caps a page's body; a larger page is refused unread.
	MaxBytes int `yaml:"max_bytes"`
	// Share splits the scrapes between the instances of a cluster (with
	// cluster.nats only): each replica is scraped by one of them, its
	// owner, which shares the figures; the others use them while they are
	// at most two of the owner's scrape gaps old and scrape it themselves
	// after. Every front scraping every replica is fronts x replicas x 4
	// scrapes a second. Default on (nil).
	Share *bool `yaml:"share"`
}

// Shared reports whether the scrapes are split between cluster
// instances (engine_metrics.share, default true; cluster sync required).
func (m *EngineMetricsConfig) Shared() bool { return m.Share == nil || *m.Share }

// ClusterConfig configures the prefix-decision exchange between turnout
// instances over NATS. Off unless NATS is set.
type ClusterConfig struct {
	// NATS is the server URL list (comma-separated), e.g. nats://127.0.0.1:4222.
	NATS string `yaml:"nats"`
	// Name identifies this instance to its peers (default: the hostname).
	Name string `yaml:"name"`
	// Subject prefixes the per-pool subjects: <subject>.<pool>.
	Subject string `yaml:"subject"`
	// BatchDelay and BatchSize bound how long and how many decisions wait
	// before one message is published.
	BatchDelay Duration `yaml:"batch_delay"`
	BatchSize  int      `yaml:"batch_size"`
	// Queue bounds decisions waiting for the publisher; beyond it they are
	// dropped (counted), never waited for.
	Queue int `yaml:"queue"`
}

// Enabled reports whether cluster sync is configured.
func (c *ClusterConfig) Enabled() bool { return c.NATS != "" }

func (c *Config) applyLoadDefaults() {
	m := &c.EngineMetrics
	orDefault(&m.Path, "/metrics")
	orDefault(&m.Interval, Duration(250*time.Millisecond))
	orDefault(&m.IdleInterval, Duration(max(2*time.Second, m.Interval.D())))
	orDefault(&m.Timeout, Duration(min(200*time.Millisecond, m.Interval.D())))
	orDefault(&m.MaxBytes, 4<<20) // vLLM pages with histograms are ~100 KiB
	cl := &c.Cluster
	orDefault(&cl.Subject, "turnout.prefix")
	orDefault(&cl.BatchDelay, Duration(5*time.Millisecond))
	orDefault(&cl.BatchSize, 64)
	orDefault(&cl.Queue, 4096)
}

func (c *Config) validateLoad(bad func(field, format string, a ...any)) {
	m := &c.EngineMetrics
	if !strings.HasPrefix(m.Path, "/") || strings.ContainsAny(m.Path, " \t\r\n\"'") {
		bad("engine_metrics.path", "%q is not an absolute path", m.Path)
	}
	if m.Interval.D() < 10*time.Millisecond || m.Interval.D() > time.Minute {
		bad("engine_metrics.interval", "%s out of range [10ms, 1m]", m.Interval.D())
	}
	if m.IdleInterval.D() < m.Interval.D() || m.IdleInterval.D() > 10*time.Minute {
		bad("engine_metrics.idle_interval", "%s out of range [interval %s, 10m]", m.IdleInterval.D(), m.Interval.D())
	}
	if m.Timeout.D() <= 0 || m.Timeout.D() > m.Interval.D()*4 {
		bad("engine_metrics.timeout", "%s must be positive and at most 4 x interval", m.Timeout.D())
	}
	if m.MaxBytes < 1024 || m.MaxBytes > 64<<20 {
		bad("engine_metrics.max_bytes", "%d out of range [1024, 64MiB]", m.MaxBytes)
	}
	cl := &c.Cluster
	if cl.NATS != "" {
		for _, u := range strings.Split(cl.NATS, ",") {
			pu, err := url.Parse(strings.TrimSpace(u))
			if err != nil || (pu.Scheme != "nats" && pu.Scheme != "tls") || pu.Host == "" {
				bad("cluster.nats", "%q is not a nats:// URL", u)
			}
		}
	}
	if len(cl.Name) > 64 || strings.ContainsAny(cl.Name, " \t\r\n") {
		bad("cluster.name", "%q must be at most 64 characters without spaces", cl.Name)
	}
	if cl.Subject == "" || strings.ContainsAny(cl.Subject, " \t\r\n*>") || strings.HasPrefix(cl.Subject, ".") || strings.HasSuffix(cl.Subject, ".") {
		bad("cluster.subject", "%q is not a NATS subject prefix", cl.Subject)
	}
	if cl.BatchDelay.D() < 0 || cl.BatchDelay.D() > time.Second {
		bad("cluster.batch_delay", "%s out of range [0, 1s]", cl.BatchDelay.D())
	}
	if cl.BatchSize < 1 || cl.BatchSize > 4096 {
		bad("cluster.batch_size", "%d out of range [1, 4096]", cl.BatchSize)
	}
	if cl.Queue < 16 || cl.Queue > 1<<20 {
		bad("cluster.queue", "%d out of range [16, 1M]", cl.Queue)
	}
}

// String describes the cluster settings for logs.
func (c *ClusterConfig) String() string {
	return fmt.Sprintf("nats=%s name=%s subject=%s batch=%s/%d", c.NATS, c.Name, c.Subject, c.BatchDelay.D(), c.BatchSize)
}
