package engineload

import (
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Share splits the scrapes between the instances of a cluster
// (route/cluster's Sync implements it over NATS): each replica has one
// owner, which scrapes it and shares the figures; the others apply them
// as they arrive and scrape the replica themselves only while the owner's
// figures are stale. N fronts then cost each replica the scrapes of one.
type Share interface {
	// Owns reports whether this instance scrapes endpoint (true when it
	// knows no peer).
	Owns(endpoint string) bool
	// Publish queues this instance's figures for an endpoint it owns (nil:
	// the scrape failed); next is the gap to its next scrape.
	Publish(endpoint string, load *fleet.EngineLoad, next time.Duration)
	// Flush sends what Publish queued (the scraper calls it once a round;
	// with nothing queued, at most a heartbeat now and then).
	Flush()
	// OnFigures registers the receiver of a peer's figures.
	OnFigures(fn func(endpoint []byte, load *fleet.EngineLoad, next time.Duration))
}

// SetShare splits the scrapes with the cluster's other instances (call
// before Run; engine_metrics.share turns it off without a restart).
func (s *Scraper) SetShare(sh Share) {
	s.share = sh
	sh.OnFigures(s.applyShared)
}

// applyShared applies an owner's figures to the replica's pool entries,
// marked against the in-flight counts as they arrive here.
func (s *Scraper) applyShared(endpoint []byte, load *fleet.EngineLoad, next time.Duration) {
	if !s.srv.Snapshot().Config.EngineMetrics.Shared() {
		return
	}
	s.mu.Lock()
	t := s.eps[string(endpoint)]
	s.mu.Unlock()
	if t == nil {
		return
	}
	p := t.eps.Load()
	if p == nil || len(*p) == 0 {
		return
	}
	eps := *p
	s.startWindow(t, eps)
	marks, peers := make([]int64, len(eps)), make([]int64, len(eps))
	for i, e := range eps {
		marks[i], peers[i] = e.DecisionMark(), e.PeerMark()
	}
	s.setLoad(eps, load, marks, peers)
	d, _ := activity(eps)
	t.sharedSeen.Store(d)
	t.sharedNext.Store(int64(next))
	t.sharedAt.Store(s.now().UnixNano())
	t.shared.Add(1)
}

// fresh reports whether the owner's last figures for t still stand: at
// most two of the owner's scrape gaps old, or two intervals once this
// instance sent the replica requests since they came (the owner may
// not know of them and scrape at its idle gap).
func (t *target) fresh(now time.Time, eps []*fleet.Endpoint, cfg *config.EngineMetricsConfig) bool {
	at := t.sharedAt.Load()
	if at == 0 {
		return false
	}
	limit := 2 * max(time.Duration(t.sharedNext.Load()), cfg.Interval.D())
	if d, busy := activity(eps); busy || d != t.sharedSeen.Load() {
		limit = 2 * cfg.Interval.D()
	}
	return now.Sub(time.Unix(0, at)) <= limit
}
