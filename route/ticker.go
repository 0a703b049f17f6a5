package route

import (
	"context"
	"sync/atomic"
	"time"
)

// Ticker is the Decider's periodic work: the decision ledger's TTL sweep,
// then the hooks others add (route/feedback's feedback and stall checks).
// control runs it (Run); tests and simulations drive time with Sweep.
type Ticker struct {
	snap *atomic.Pointer[Snapshot]
	dec  *Ledger
	// hooks run after each sweep (OnTick).
	hooks atomic.Pointer[[]func(context.Context, *Snapshot, time.Time)]
}

// Run ticks until ctx ends: each tick expires stale decisions (the
// ledger's sweep), then runs the OnTick hooks (route/feedback watches
// completion feedback and stalled endpoints there). Ticks come a quarter
// of the smallest stall limit apart, within 100ms..1s. Beside them runs
// the heartbeat that notices the process was paused (abandon.go).
func (k *Ticker) Run(ctx context.Context) {
	go k.dec.pause.run(ctx)
	t := time.NewTimer(stallTick(k.snap.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			snap := k.snap.Load()
			k.tick(ctx, snap, now)
			t.Reset(stallTick(snap))
		}
	}
}

// stallTick is how often decisions are swept: a quarter of the smallest
// stall limit, within 100ms..1s (1s, the TTL sweep, when detection is off).
func stallTick(snap *Snapshot) time.Duration {
	t := time.Second
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			if b := time.Duration(e.State.Stall.Limit()); b > 0 {
				t = min(t, max(b/4, 100*time.Millisecond))
			}
		}
	}
	return t
}

// tick runs the periodic work: the decision ledger's TTL sweep (which also
// marks endpoints holding a decision past half their stall limit, while
// completions arrive), then the hooks (route/feedback: feedback and stall
// checks).
func (k *Ticker) tick(ctx context.Context, snap *Snapshot, now time.Time) {
	healthy := !k.dec.fbStalled.Load() && k.dec.completed.Load() > 0
	k.dec.sweep(now, snap.Config.DecisionTTL.D(), healthy)
	if hooks := k.hooks.Load(); hooks != nil {
		for _, fn := range *hooks {
			fn(ctx, snap, now)
		}
	}
}

// Sweep runs one tick of Run at now: the ledger's TTL sweep, then the
// hooks (tests and simulations drive time with it).
func (k *Ticker) Sweep(ctx context.Context, now time.Time) { k.tick(ctx, k.snap.Load(), now) }

// OnTick registers a hook run on every tick of Run, after the ledger's
// sweep (route/feedback's checks).
func (k *Ticker) OnTick(fn func(ctx context.Context, snap *Snapshot, now time.Time)) {
	for {
		old := k.hooks.Load()
		var next []func(context.Context, *Snapshot, time.Time)
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, fn)
		if k.hooks.CompareAndSwap(old, &next) {
			return
		}
	}
}
