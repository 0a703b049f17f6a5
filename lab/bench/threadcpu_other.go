//go:build !linux

package bench

import "time"

var processStart = time.Now()

// threadCPU falls back to the wall clock where the thread's CPU clock is
// not read (the sim's sync cost then counts other processes' time too).
func threadCPU() time.Duration { return time.Since(processStart) }

// selfCPU falls back to the wall clock too.
func selfCPU() (time.Duration, error) { return time.Since(processStart), nil }
