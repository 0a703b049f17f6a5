package cluster

import (
	"fmt"
	"strings"
	"time"
)

// Hand-off drops made visible: a prefix decision this instance could not
// share (its queue full under CPU contention, NATS unreachable, a publish
// error) leaves peers placing that prompt without it. Counted already in
// turnout_cluster_decisions_total; here they also get a /readyz?verbose
// line and a warning at most once per dropLogEvery with how many since the
// last one (the last sessions saw ~9% dropped silently in a parallel
// benchmark).

// dropLogEvery rate-limits the drop warning.
const dropLogEvery = time.Minute

// drops is the total of decisions not shared.
func (s *Sync) drops() (full, down, perr, total uint64) {
	full, down, perr = s.dropFull.Load(), s.dropDown.Load(), s.dropErr.Load()
	return full, down, perr, full + down + perr
}

// noteDrops warns about decisions dropped since the last warning, at most
// once per dropLogEvery (the publisher calls it on every tick).
func (s *Sync) noteDrops(now time.Time) {
	full, down, perr, total := s.drops()
	logged := s.dropLogged.Load()
	if total == logged || now.UnixNano()-s.dropLogAt.Load() < int64(dropLogEvery) {
		return
	}
	s.dropLogged.Store(total)
	s.dropLogAt.Store(now.UnixNano())
	s.log.Warn().Uint64("dropped", total-logged).Uint64("queue_full_total", full).Uint64("disconnected_total", down).Uint64("error_total", perr).
		Msg("cluster: prefix decisions not shared with peers (they place those prompts without this instance's view; queue full means CPU contention or a slow NATS: see cluster.queue)")
}

// writeReadiness is the cluster line of /readyz?verbose (readiness does not
// depend on it).
func (s *Sync) writeReadiness(b *strings.Builder) {
	state := "connected to NATS"
	if !s.connected.Load() {
		state = "NATS UNREACHABLE"
	}
	full, down, perr, total := s.drops()
	pub := s.publishedDec.Load()
	fmt.Fprintf(b, "cluster: %s; %d prefix decisions shared, %d dropped", state, pub, total)
	if total > 0 {
		fmt.Fprintf(b, " (%.1f%%: queue full %d, disconnected %d, error %d)", 100*float64(total)/float64(total+pub), full, down, perr)
	}
	b.WriteString("\n")
}

// A subscription's backlog bound: past it the NATS client drops the
// peers' messages (a slow consumer: this instance's CPU starved) and
// calls the error handler once; slowDropped counts them.
const (
	pendingMsgs  = 4096
	pendingBytes = 64 << 20
)

// slowDropped is the peers' messages the NATS client dropped because this
// instance fell behind: decisions and figures its view lacks.
func (s *Sync) slowDropped() uint64 {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	n := s.gone.Load()
	for _, sub := range s.subs {
		if d, err := sub.Dropped(); err == nil {
			n += uint64(d)
		}
	}
	if s.engSub != nil {
		if d, err := s.engSub.Dropped(); err == nil {
			n += uint64(d)
		}
	}
	return n
}
