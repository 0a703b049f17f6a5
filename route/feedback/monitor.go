package feedback

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/promtext"
	"github.com/turnout/turnout/route"
)

// Loop is a Decider's view of completion feedback and endpoint
// stalls: whether completions still arrive, and who may send them.
type Loop struct {
	d   *route.Decider
	log *zerolog.Logger

	mon          feedbackMonitor
	fbRejectLog  rateLog
	stallMu      sync.Mutex // serializes degrading, so a pool keeps one endpoint
	stallLastLog rateLog
	probeClient  *http.Client

	// lines and bad count feedback lines read and unparseable; rejected
	// the ones from a wrong source or without the token; stallProbes the
	// stall probes (ok, stalled).
	lines, bad, rejected atomic.Uint64
	stallProbes          [2]atomic.Uint64
}

// New returns the feedback loop of d and hooks it into d: its checks run
// on every tick of d.Run, its metrics and readiness lines join d's, and
// each config applied is checked for policies that need feedback.
func New(d *route.Decider) *Loop {
	l := &Loop{d: d, log: d.Log(), probeClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}}
	d.Ticker().OnTick(l.tick)
	d.Extras().AddMetrics(l.writeMetrics)
	d.Extras().AddReadiness(l.writeReadiness)
	d.OnApply(l.warnFeedbackOff)
	return l
}

// feedbackMonitor notices when decisions are made but completions stop
// arriving (a wrong feedback address, a proxy logging elsewhere, a firewall):
// in-flight counts then only fall at decision_ttl and load balancing skews.
type feedbackMonitor struct {
	mu      sync.Mutex
	stalled atomic.Bool
	ageNs   atomic.Int64  // since the last completion (or start)
	pending atomic.Uint64 // decisions opened since then
	warn    rateLog
	// The tick notes when the completion count last moved: within one
	// tick (<= 1 s) of the real last completion, against
	// feedback.stalled_after (>= 1 s, default 1 min), with no clock read
	// per completion. The decisions opened by then are recorded by the
	// completion itself (decisions.openedAtClose).
	lastDone    uint64
	lastCloseNs int64
}

// tick runs the periodic work: TTL expiry, feedback and stall checks.
func (l *Loop) tick(ctx context.Context, snap *route.Snapshot, now time.Time) {
	l.checkFeedback(snap.Config, now)
	l.checkStalls(ctx, snap, now)
}

// checkFeedback updates the monitor; it warns (at most every 5 minutes) when
// completions stopped while decisions are made.
func (l *Loop) checkFeedback(cfg *config.Config, now time.Time) {
	m := &l.mon
	m.mu.Lock()
	defer m.mu.Unlock()
	opened, done, openedAtClose := l.d.Ledger().Counts()
	if m.lastCloseNs == 0 || done != m.lastDone {
		m.lastDone, m.lastCloseNs = done, now.UnixNano()
	}
	age := max(time.Duration(now.UnixNano()-m.lastCloseNs), 0)
	made := opened - min(openedAtClose, opened)
	m.ageNs.Store(int64(age))
	m.pending.Store(made)
	// Without a feedback listener and before any completion, feedback is
	// simply off: nothing stopped.
	off := cfg.Feedback.Syslog == "" && done == 0
	if off || age < cfg.Feedback.StalledAfter.D() || made < uint64(cfg.Feedback.StalledMinDecisions) {
		if m.stalled.Swap(false) {
			l.d.Ledger().SetFeedbackStalled(false)
			ev := l.log.Info()
			if age < cfg.Feedback.StalledAfter.D() {
				// Completions arrive again: the decisions the gap left open
				// are closed now, not at decision_ttl, so in-flight is right
				// from this tick on (each endpoint keeps its engine's count).
				ev = ev.Uint64("reconciled", l.d.Ledger().Reconcile(now))
			}
			ev.Msg("completion feedback arriving again")
		}
		return
	}
	m.stalled.Store(true)
	l.d.Ledger().SetFeedbackStalled(true)
	if m.warn.allow(now, 5*time.Minute) {
		l.log.Warn().Dur("since_last_completion", age).Uint64("decisions", made).Str("feedback", cfg.Feedback.Syslog).
			Msg("completion feedback stopped while decisions are made: in-flight counts only fall at decision_ttl and balancing skews; check the proxy's log target, feedback.sources and feedback.token (turnout_feedback_lines_total)")
	}
}

// Stalled reports whether completions stopped arriving while
// decisions are made.
func (l *Loop) Stalled() bool { return l.mon.stalled.Load() }

// writeReadiness appends, for /readyz?verbose, one line on
// completion feedback and one per degraded endpoint; readiness does not
// depend on them.
func (l *Loop) writeReadiness(b *strings.Builder) {
	b.WriteString(l.feedbackStatus())
	snap := l.d.Snapshot()
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			if e.Degraded() {
				fmt.Fprintf(b, "endpoint %s (pool %s): degraded for %s: stalled past its %s limit\n",
					e.Name, p.Name, time.Since(time.Unix(0, e.State.Stall.Since.Load())).Round(time.Second),
					time.Duration(e.State.Stall.Limit()))
			}
		}
	}
}

// feedbackStatus is the feedback line of /readyz?verbose.
func (l *Loop) feedbackStatus() string {
	cfg := l.d.Snapshot().Config
	_, done, _ := l.d.Ledger().Counts()
	age := time.Duration(l.mon.ageNs.Load()).Round(time.Second)
	switch {
	case l.mon.stalled.Load():
		return fmt.Sprintf("feedback: STALLED: no completion for %s while %d decisions were made (check the proxy log target %s)\n", age, l.mon.pending.Load(), cfg.Feedback.Syslog)
	case cfg.Feedback.Syslog == "" && done == 0:
		return "feedback: off (feedback.disable): in-flight counts fall only at decision_ttl\n"
	case done == 0:
		return "feedback: waiting for the first completion\n"
	}
	return fmt.Sprintf("feedback: ok: %d completions, last within %s\n", done, max(age, time.Second))
}

// writeFeedbackHealthMetrics renders the feedback and stall gauges.
func (l *Loop) writeHealthMetrics(b *strings.Builder) {
	help := promtext.Helper(b)
	stalled := 0
	if l.mon.stalled.Load() {
		stalled = 1
	}
	help("turnout_feedback_stalled", "gauge", "1 when completions stopped arriving while decisions are made (feedback.stalled_after).")
	fmt.Fprintf(b, "turnout_feedback_stalled %d\n", stalled)
	help("turnout_feedback_last_completion_age_seconds", "gauge", "Time since a completion last arrived (0 while they arrive; counted from start).")
	fmt.Fprintf(b, "turnout_feedback_last_completion_age_seconds %g\n", time.Duration(l.mon.ageNs.Load()).Seconds())
	help("turnout_feedback_rejected_total", "counter", "Feedback datagrams or lines dropped: source not in feedback.sources, or missing/wrong token.")
	fmt.Fprintf(b, "turnout_feedback_rejected_total %d\n", l.rejected.Load())
	help("turnout_stall_probes_total", "counter", "Stall probes by result (stalled: no answer within the budget).")
	fmt.Fprintf(b, "turnout_stall_probes_total{result=\"ok\"} %d\n", l.stallProbes[0].Load())
	fmt.Fprintf(b, "turnout_stall_probes_total{result=\"stalled\"} %d\n", l.stallProbes[1].Load())
	help("turnout_endpoint_degraded", "gauge", "1 when stall detection took the endpoint out of rotation.")
	for _, p := range l.d.Snapshot().Pools() {
		for _, e := range p.Endpoints {
			v := 0
			if e.Degraded() {
				v = 1
			}
			fmt.Fprintf(b, "turnout_endpoint_degraded{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, e.Name, v)
		}
	}
	help("turnout_endpoint_stall_limit_seconds", "gauge", "Time to first byte an endpoint must meet before stall detection probes it: health.stall.scale x its p99 first-token time, within health.stall.floor..budget (0: detection off).")
	for _, p := range l.d.Snapshot().Pools() {
		for _, e := range p.Endpoints {
			fmt.Fprintf(b, "turnout_endpoint_stall_limit_seconds{deployment=%q,pool=%q,endpoint=%q} %g\n", p.Deployment, p.Name, e.Name, time.Duration(e.State.Stall.Limit()).Seconds())
		}
	}
}
