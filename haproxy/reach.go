package haproxy

import (
	"context"
	"sync/atomic"
	"time"
)

// reachWatch says when HAProxy's runtime API answers again after a sync
// found it unreachable (the documented start order, turnout then HAProxy,
// always begins with "not reachable"): an operator reading the log sees
// the warning followed by "HAProxy connected", not a warning left alone.
type reachWatch struct {
	watching atomic.Bool
}

// reachPoll is how often an unreachable runtime API is tried again.
const reachPoll = time.Second

// watch polls socket until it answers (then logs it once) or ctx ends; one
// watcher at a time.
func (s *Syncer) watchReachable(ctx context.Context, socket string) {
	if !s.reach.watching.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.reach.watching.Store(false)
		t := time.NewTicker(reachPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := s.opts.dial(ctx, socket); err == nil {
				s.log.Info().Str("socket", socket).Msg("HAProxy connected: its runtime API answers")
				return
			}
		}
	}()
}
