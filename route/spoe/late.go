package spoe

import "sync/atomic"

// lateness tells a message HAProxy already gave up on: read more than its
// timeout processing after HAProxy sent it (ArgSent, HAProxy's clock in
// ms). A turnout that was stopped resumes with such a backlog; HAProxy has
// balanced those requests by itself, so a decision opened for one would
// stay open with no request behind it.
//
// The two clocks need not agree: a message's lag (agent clock minus sent)
// is measured against the smallest lag seen (the clocks' offset plus the
// fastest delivery). A run of late messages that lasts longer than the
// budget by the agent's clock is no backlog (one drains in milliseconds)
// but a clock step: the smallest lag starts again from it.
type lateness struct {
	base  atomic.Int64 // smallest lag seen, ms
	seen  atomic.Bool
	since atomic.Int64 // agent ms of the current run of late messages; 0: none
}

// late reports whether a message sent at sent (HAProxy ms), read at now
// (agent ms), came past budget (ms), and notes its lag.
func (l *lateness) late(now, sent, budget int64) bool {
	lag := now - sent
	if !l.seen.Load() || lag < l.base.Load() {
		l.base.Store(lag)
		l.seen.Store(true)
		l.since.Store(0)
		return false
	}
	if !l.past(now, sent, budget) {
		if l.since.Load() != 0 {
			l.since.Store(0)
		}
		return false
	}
	since := l.since.Load()
	switch {
	case since == 0:
		l.since.Store(now)
	case now-since > budget:
		l.base.Store(lag)
		l.since.Store(0)
		return false
	}
	return true
}

// past reports whether a message sent at sent is past budget at now,
// without noting anything (the check after a decision).
func (l *lateness) past(now, sent, budget int64) bool {
	return l.seen.Load() && now-sent-l.base.Load() > budget
}
