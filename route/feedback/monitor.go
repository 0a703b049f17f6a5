package feedback

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
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
