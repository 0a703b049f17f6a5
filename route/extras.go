package route

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Extras are the writers other packages add to what the Decider reports:
// /metrics lines (KV index stats, feedback health, ...) and
// /readyz?verbose lines that never change readiness itself.
type Extras struct {
	metrics   atomic.Pointer[[]func(*strings.Builder)]
	mu        sync.Mutex // guards readiness
	readiness []func(*strings.Builder)
}

// AddMetrics registers an extra metrics writer (e.g. KV index stats).
func (x *Extras) AddMetrics(fn func(*strings.Builder)) {
	for {
		old := x.metrics.Load()
		var next []func(*strings.Builder)
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, fn)
		if x.metrics.CompareAndSwap(old, &next) {
			return
		}
	}
}

// writeMetrics runs the AddMetrics writers.
func (x *Extras) writeMetrics(b *strings.Builder) {
	if ex := x.metrics.Load(); ex != nil {
		for _, fn := range *ex {
			fn(b)
		}
	}
}

// AddReadiness registers a writer of extra /readyz?verbose lines (facts
// that never change readiness itself: completion feedback, degraded
// endpoints).
func (x *Extras) AddReadiness(fn func(*strings.Builder)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.readiness = append(x.readiness, fn)
}

// WriteReadinessNotes writes the AddReadiness lines.
func (x *Extras) WriteReadinessNotes(b *strings.Builder) {
	x.mu.Lock()
	fns := x.readiness
	x.mu.Unlock()
	for _, fn := range fns {
		fn(b)
	}
}
