package route

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/route/contract"
)

// Calls the proxy gave up on. A turnout that was not running for a while
// (SIGSTOP, a frozen VM, a starved process) resumes with a backlog of
// calls the proxy already abandoned at its route timeout and sent
// elsewhere; a decision opened for one would stay open, holding its
// endpoint's in-flight count, until decision_ttl: no feedback line names
// it. Such a decision is closed at once and counted as abandoned.
//
// Whether a caller is still there is a syscall per call (contract.Watch),
// too dear for every decision; it is asked only while the process may just
// have been paused: its heartbeat came late, or has not come yet.

const (
	// beatEvery is the heartbeat's period.
	beatEvery = 50 * time.Millisecond
	// pauseGap: a heartbeat later than this after the previous one means
	// the process was not running (a GC pause or a busy box delays it by
	// far less).
	pauseGap = 250 * time.Millisecond
	// pauseGrace is how long after a pause decisions ask their Watch: time
	// to work through the backlog that piled up meanwhile.
	pauseGrace = 2 * time.Second
)

// pauseWatch notes when the process last ran its heartbeat.
type pauseWatch struct {
	beat  atomic.Int64 // unix ns of the last heartbeat; 0: not running
	until atomic.Int64 // unix ns until which a pause is suspected
}

// run beats every beatEvery until ctx ends (Ticker.Run starts it).
func (p *pauseWatch) run(ctx context.Context) {
	tk := time.NewTicker(beatEvery)
	defer tk.Stop()
	p.beat.Store(time.Now().UnixNano())
	for {
		select {
		case <-ctx.Done():
			p.beat.Store(0)
			return
		case <-tk.C:
		}
		now := time.Now().UnixNano()
		if last := p.beat.Swap(now); now-last > int64(pauseGap) {
			p.until.Store(now + int64(pauseGrace))
		}
	}
}

// suspect reports whether the process may have been paused around now
// (unix ns): the heartbeat is overdue (it has not run since the process
// resumed), or came late within pauseGrace.
func (p *pauseWatch) suspect(now int64) bool {
	b := p.beat.Load()
	return b != 0 && now-b > int64(pauseGap) || now < p.until.Load()
}

// dropAbandoned closes the decision of v at once when the process may
// have been paused and the caller is gone (in.Watch).
func (t *Txn) dropAbandoned(in *contract.Input, v *contract.Verdict, start time.Time) {
	if v.Decision == 0 || in.Watch == nil || !t.d.dec.pause.suspect(start.UnixNano()) {
		return
	}
	if in.Watch.Gone() {
		t.d.dec.Abandon(v.Decision)
	}
}

// Abandon closes a decision whose caller gave up before the verdict
// reached it (the proxy timed the call out and balanced the request by
// itself); it reports whether the decision was open. Counted apart from
// completions: no feedback came.
func (d *Ledger) Abandon(id uint64) bool {
	s := &d.slots[id&d.mask]
	s.mu.Lock()
	st := s.openState()
	if s.id != id || st == nil {
		s.mu.Unlock()
		return false
	}
	s.end = endClosed
	pool, uncached := s.pool, s.pred.Uncached
	s.mu.Unlock()
	st.Inflight.Add(-1)
	if uncached != 0 {
		st.Pending.Add(-int64(uncached))
	}
	d.abandoned.Add(1)
	if pool != nil && pool.OnFree != nil {
		pool.OnFree()
	}
	return true
}
