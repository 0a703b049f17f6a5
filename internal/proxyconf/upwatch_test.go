package proxyconf

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestUpWatch: one watcher at a time, it stops at the first true, and a
// later Watch starts a new one.
func TestUpWatch(t *testing.T) {
	var w UpWatch
	var calls, second atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.Watch(ctx, func(context.Context) bool { return calls.Add(1) >= 2 })
	w.Watch(ctx, func(context.Context) bool { second.Add(1); return true }) // dropped: one is watching
	waitFor(t, "the first watch to end", func() bool { return calls.Load() >= 2 && !w.watching.Load() })
	if n := second.Load(); n != 0 {
		t.Errorf("the second watch ran %d times while the first watched", n)
	}
	// watching is cleared only when the watcher's goroutine returns.
	if n := calls.Load(); n != 2 {
		t.Errorf("up called %d times, want 2 (false, then true)", n)
	}
	w.Watch(ctx, func(context.Context) bool { second.Add(1); return true })
	waitFor(t, "a new watch after the first ended", func() bool { return second.Load() == 1 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
