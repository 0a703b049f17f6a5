package fleet

import (
	"sync/atomic"
	"time"
)

// Clock is the time policies' time-dependent state reads (the candidate
// index's pass age), in unix nanoseconds. The service reads the wall
// clock; a benchmark gives a synthetic one it advances per decision, so
// the work a decision does does not depend on how fast the one before it
// ran (valgrind, a loaded box).
type Clock interface{ Now() int64 }

// WallClock is the real clock, what a nil Clock in PolicyEnv means.
type WallClock struct{}

// Now implements Clock.
func (WallClock) Now() int64 { return time.Now().UnixNano() }

// StepClock is a synthetic clock that moves only when told to.
type StepClock struct{ ns atomic.Int64 }

// Now implements Clock.
func (c *StepClock) Now() int64 { return c.ns.Load() }

// Advance moves the clock on by d.
func (c *StepClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// ClockOr is c, or the wall clock when c is nil.
func ClockOr(c Clock) Clock {
	if c == nil {
		return WallClock{}
	}
	return c
}

var (
	_ Clock = WallClock{}
	_ Clock = (*StepClock)(nil)
)
