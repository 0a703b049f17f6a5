package tick

import (
	"context"
	"testing"
	"time"
)

func TestEveryStopsWhenFnIsDone(t *testing.T) {
	calls := 0
	Every(context.Background(), time.Millisecond, func(context.Context) bool {
		calls++
		return calls < 3
	})
	if calls != 3 {
		t.Fatalf("fn called %d times, want 3 (it said done on the third)", calls)
	}
}

func TestEveryStopsWhenCtxEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	calls := 0
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func(context.Context) bool {
			calls++
			if calls == 2 {
				cancel()
			}
			return true
		})
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Every did not return after ctx ended")
	}
	if calls != 2 {
		t.Fatalf("fn called %d times after ctx ended, want 2", calls)
	}
}
