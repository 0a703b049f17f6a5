package proxyconf

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/tick"
)

// UpWatch says when a proxy that a sync found down is up again (the
// documented start order, turnout then the proxy, always begins with the
// sync's warning): an operator reading the log sees the warning followed
// by one line saying the proxy is up, not a warning left alone.
type UpWatch struct {
	watching atomic.Bool
}

// upPoll is how often a proxy found down is tried again.
const upPoll = time.Second

// Watch calls up every second until it reports true (up logs the line) or
// ctx ends. A call while a watch runs does nothing: one watcher at a time.
func (w *UpWatch) Watch(ctx context.Context, up func(context.Context) bool) {
	if !w.watching.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer w.watching.Store(false)
		tick.Every(ctx, upPoll, func(ctx context.Context) bool { return !up(ctx) })
	}()
}
