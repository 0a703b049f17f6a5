package mock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestTimingModel(t *testing.T) {
	base := Timing{TTFTOverhead: 100 * time.Millisecond, PerTokenPrefill: time.Millisecond, InterTokenLatency: 20 * time.Millisecond}
	tests := []struct {
		scale             float64
		uncached, out     int
		ttft, itl, totalD time.Duration
	}{
		{scale: 1, uncached: 50, out: 4, ttft: 150 * time.Millisecond, itl: 20 * time.Millisecond, totalD: 210 * time.Millisecond},
		{scale: 0.1, uncached: 50, out: 4, ttft: 15 * time.Millisecond, itl: 2 * time.Millisecond, totalD: 21 * time.Millisecond},
		{scale: 1, uncached: 0, out: 1, ttft: 100 * time.Millisecond, itl: 20 * time.Millisecond, totalD: 100 * time.Millisecond},
		{scale: 0, uncached: 1000, out: 100, ttft: 0, itl: 0, totalD: 0},
		{scale: 1, uncached: -5, out: 0, ttft: 100 * time.Millisecond, itl: 20 * time.Millisecond, totalD: 100 * time.Millisecond},
	}
	for _, tc := range tests {
		tm := base
		tm.TimeScale = tc.scale
		if got := tm.TTFT(tc.uncached); got != tc.ttft {
			t.Errorf("scale %v: TTFT(%d) = %v, want %v", tc.scale, tc.uncached, got, tc.ttft)
		}
		if got := tm.ITL(); got != tc.itl {
			t.Errorf("scale %v: ITL = %v, want %v", tc.scale, got, tc.itl)
		}
		if got := tm.Total(tc.uncached, tc.out); got != tc.totalD {
			t.Errorf("scale %v: Total = %v, want %v", tc.scale, got, tc.totalD)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSchedulerFIFO(t *testing.T) {
	s := NewScheduler(2)
	ctx := context.Background()
	for range 2 {
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Acquire(ctx); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}()
		// Enqueue one at a time so arrival order is known.
		waitFor(t, "waiter queued", func() bool { return s.Waiting() == i+1 })
	}
	if s.Running() != 2 {
		t.Fatalf("Running = %d", s.Running())
	}
	for i := range 4 {
		s.Release()
		// Grants are FIFO; wait for each so the recording order is the grant order.
		waitFor(t, "grant", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == i+1 })
	}
	wg.Wait()
	if !slices.Equal(order, []int{0, 1, 2, 3}) {
		t.Fatalf("admission order %v, want FIFO", order)
	}
	if s.Running() != 2 || s.Waiting() != 0 {
		t.Fatalf("running %d waiting %d", s.Running(), s.Waiting())
	}
	s.Release()
	s.Release()
	if s.Running() != 0 {
		t.Fatalf("Running = %d after releasing all", s.Running())
	}
}

func TestSchedulerCancelledWaiter(t *testing.T) {
	s := NewScheduler(1)
	if err := s.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Acquire(ctx) }()
	waitFor(t, "waiter queued", func() bool { return s.Waiting() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if s.Waiting() != 0 {
		t.Fatalf("Waiting = %d after cancel", s.Waiting())
	}
	s.Release()
	if s.Running() != 0 {
		t.Fatalf("Running = %d", s.Running())
	}
}

func TestSchedulerUnlimited(t *testing.T) {
	s := NewScheduler(0)
	for range 1000 {
		if err := s.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if s.Running() != 1000 || s.Waiting() != 0 {
		t.Fatalf("running %d waiting %d", s.Running(), s.Waiting())
	}
}
