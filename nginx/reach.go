package nginx

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/proxyconf"
)

// runWatch says when nginx runs after a sync found it not running (the
// documented start order, turnout then nginx, always begins with "nginx is
// not running"): the warning is followed by "nginx running", not left alone.
type runWatch struct {
	watching atomic.Bool
	// poll is how often the pid file is read again (a second unless a test
	// sets it).
	poll time.Duration
}

// watchRunning polls pidFile until it names a live nginx (then logs it once)
// or ctx ends; one watcher at a time.
func (s *Syncer) watchRunning(ctx context.Context, pidFile string) {
	if !s.run.watching.CompareAndSwap(false, true) {
		return
	}
	every := s.run.poll
	if every <= 0 {
		every = time.Second
	}
	go func() {
		defer s.run.watching.Store(false)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if pid, err := proxyconf.ReadPID(pidFile, "nginx"); err == nil {
				s.log.Info().Int(fieldPID, pid).Msg("nginx running: it loaded the written files")
				return
			}
		}
	}()
}
