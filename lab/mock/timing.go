package mock

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Timing is the latency model. All returned durations are already multiplied
// by TimeScale; a TimeScale of 0 (or less) makes every duration 0.
type Timing struct {
	TTFTOverhead      time.Duration // fixed cost before the first token
	PerTokenPrefill   time.Duration // cost per uncached prompt token
	InterTokenLatency time.Duration // gap between output tokens
	TimeScale         float64
}

// Scale multiplies d by TimeScale.
func (t Timing) Scale(d time.Duration) time.Duration {
	if t.TimeScale <= 0 || d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * t.TimeScale)
}

// TTFT is the time to first token for a prompt with `uncached` tokens that
// must be prefilled.
func (t Timing) TTFT(uncached int) time.Duration {
	return t.Scale(t.TTFTOverhead + time.Duration(max(uncached, 0))*t.PerTokenPrefill)
}

// ITL is the scaled inter-token latency.
func (t Timing) ITL() time.Duration { return t.Scale(t.InterTokenLatency) }

// Total is the end-to-end latency of a request producing outputTokens tokens
// once it is running: TTFT plus one ITL per token after the first.
func (t Timing) Total(uncached, outputTokens int) time.Duration {
	return t.TTFT(uncached) + time.Duration(max(outputTokens-1, 0))*t.ITL()
}

// Scheduler bounds the number of running sequences; extra ones wait in FIFO
// order, which is what vLLM's max_num_seqs does to a burst. Safe for
// concurrent use.
type Scheduler struct {
	mu      sync.Mutex
	max     int
	queue   list.List // of *waiter
	running atomic.Int64
	waiting atomic.Int64
}

type waiter struct {
	ch      chan struct{}
	granted bool
}

// NewScheduler returns a scheduler admitting maxRunning sequences at once;
// maxRunning <= 0 means unlimited (still counted).
func NewScheduler(maxRunning int) *Scheduler {
	return &Scheduler{max: maxRunning}
}

// Acquire blocks until the caller may run or ctx is done. Each successful
// Acquire must be paired with one Release.
func (s *Scheduler) Acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.max <= 0 || (int(s.running.Load()) < s.max && s.queue.Len() == 0) {
		s.running.Add(1)
		s.mu.Unlock()
		return nil
	}
	w := &waiter{ch: make(chan struct{})}
	e := s.queue.PushBack(w)
	s.waiting.Add(1)
	s.mu.Unlock()

	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		if w.granted {
			// Release handed us the slot concurrently; pass it on.
			s.mu.Unlock()
			s.Release()
			return ctx.Err()
		}
		s.queue.Remove(e)
		s.waiting.Add(-1)
		s.mu.Unlock()
		return ctx.Err()
	}
}

// Release frees a running slot, handing it directly to the oldest waiter.
func (s *Scheduler) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if front := s.queue.Front(); front != nil {
		w := s.queue.Remove(front).(*waiter)
		s.waiting.Add(-1)
		w.granted = true
		close(w.ch)
		return
	}
	s.running.Add(-1)
}

// Running is the number of sequences currently admitted.
func (s *Scheduler) Running() int { return int(s.running.Load()) }

// Waiting is the number of sequences queued for a slot.
func (s *Scheduler) Waiting() int { return int(s.waiting.Load()) }
