package feedback

import (
	"fmt"
	"strings"
	"time"
)

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
