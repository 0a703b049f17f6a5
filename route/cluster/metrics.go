package cluster

import (
	"fmt"
	"strings"
	"time"

	"github.com/turnout/turnout/internal/promtext"
)

// WriteOffMetrics renders the cluster metrics a dashboard reads, at 0,
// for a turnout without cluster sync (register with route.Decider.AddMetrics
// in place of Sync.WriteMetrics): 0, not absent.
func WriteOffMetrics(b *strings.Builder) {
	fmt.Fprintf(b, "# HELP turnout_cluster_connected %s\n# TYPE turnout_cluster_connected gauge\n", helpConnected)
	fmt.Fprintf(b, "turnout_cluster_connected{name=\"\"} 0\n")
	fmt.Fprintf(b, "# HELP turnout_cluster_messages_total %s\n# TYPE turnout_cluster_messages_total counter\n", helpMessages)
	fmt.Fprintf(b, "turnout_cluster_messages_total{direction=\"out\"} 0\nturnout_cluster_messages_total{direction=\"in\"} 0\n")
}

// The help of the metrics both writers render.
const (
	helpConnected = "1 while the NATS connection for prefix sharing is up."
	helpMessages  = "NATS messages of prefix decisions."
)

// WriteMetrics renders the cluster counters (register with route.Decider.AddMetrics).
func (s *Sync) WriteMetrics(b *strings.Builder) {
	help := promtext.Helper(b)
	c := 0
	if s.connected.Load() {
		c = 1
	}
	help("turnout_cluster_connected", "gauge", helpConnected)
	fmt.Fprintf(b, "turnout_cluster_connected{name=%q} %d\n", s.name, c)
	help("turnout_cluster_disconnects_total", "counter", "NATS connections lost.")
	fmt.Fprintf(b, "turnout_cluster_disconnects_total %d\n", s.disconnects.Load())
	help("turnout_cluster_reconnects_total", "counter", "NATS reconnections.")
	fmt.Fprintf(b, "turnout_cluster_reconnects_total %d\n", s.reconnects.Load())
	down := s.downTotalNs.Load()
	if t := s.downSince.Load(); t != 0 {
		down += uint64(time.Now().UnixNano() - t)
	}
	help("turnout_cluster_disconnected_seconds_total", "counter", "Time without NATS (the gap in shared prefix decisions).")
	fmt.Fprintf(b, "turnout_cluster_disconnected_seconds_total %g\n", float64(down)/1e9)
	help("turnout_cluster_decisions_total", "counter", "Local prefix decisions by what became of them.")
	for _, r := range []struct {
		n string
		v uint64
	}{
		{"published", s.publishedDec.Load()},
		{"dropped_queue_full", s.dropFull.Load()},
		{"dropped_disconnected", s.dropDown.Load()},
		{"dropped_error", s.dropErr.Load()},
	} {
		fmt.Fprintf(b, "turnout_cluster_decisions_total{result=%q} %d\n", r.n, r.v)
	}
	help("turnout_cluster_messages_total", "counter", helpMessages)
	fmt.Fprintf(b, "turnout_cluster_messages_total{direction=\"out\"} %d\n", s.publishedMsgs.Load())
	fmt.Fprintf(b, "turnout_cluster_messages_total{direction=\"in\"} %d\n", s.receivedMsgs.Load())
	help("turnout_cluster_load_messages_total", "counter", "NATS messages of in-flight counts (a front's load, shared with its decisions; included in turnout_cluster_messages_total).")
	fmt.Fprintf(b, "turnout_cluster_load_messages_total{direction=\"out\"} %d\n", s.loadMsgsOut.Load())
	fmt.Fprintf(b, "turnout_cluster_load_messages_total{direction=\"in\"} %d\n", s.loadMsgsIn.Load())
	help("turnout_cluster_bytes_total", "counter", "Payload bytes of prefix decision messages.")
	fmt.Fprintf(b, "turnout_cluster_bytes_total{direction=\"out\"} %d\n", s.publishedBytes.Load())
	fmt.Fprintf(b, "turnout_cluster_bytes_total{direction=\"in\"} %d\n", s.receivedBytes.Load())
	help("turnout_cluster_publisher_wakeups_total", "counter", "Times the publisher woke to drain its queue (none while idle).")
	fmt.Fprintf(b, "turnout_cluster_publisher_wakeups_total %d\n", s.ticks.Load())
	help("turnout_cluster_engine_figures_total", "counter", "Engine figures (engine_metrics.share) sent for the replicas this instance owns, and received from their owners.")
	fmt.Fprintf(b, "turnout_cluster_engine_figures_total{direction=\"out\"} %d\n", s.eng.out.Load())
	fmt.Fprintf(b, "turnout_cluster_engine_figures_total{direction=\"in\"} %d\n", s.eng.in.Load())
	help("turnout_cluster_engine_figure_messages_malformed_total", "counter", "Engine figure messages dropped whole: malformed or out of range.")
	fmt.Fprintf(b, "turnout_cluster_engine_figure_messages_malformed_total %d\n", s.eng.bad.Load())
	help("turnout_cluster_peers", "gauge", "Live peers sharing engine scrapes (heard on the figures subject within three heartbeats).")
	fmt.Fprintf(b, "turnout_cluster_peers %d\n", s.Peers())
	help("turnout_cluster_slow_consumer_dropped_total", "counter", "Peer messages the NATS client dropped before turnout read them: this instance fell behind (CPU starved) by more than 4096 messages on a subscription.")
	fmt.Fprintf(b, "turnout_cluster_slow_consumer_dropped_total %d\n", s.slowDropped())
	help("turnout_cluster_received_total", "counter", "Peer decisions (applied, unknown_*) and messages (malformed, oversized) received.")
	for i := 0; i < numRecv; i++ {
		fmt.Fprintf(b, "turnout_cluster_received_total{result=%q} %d\n", recvNames[i], s.recv[i].Load())
	}
}
