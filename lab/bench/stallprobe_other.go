//go:build !linux

package bench

import (
	"context"
	"errors"
	"time"
)

// probeStalls needs Linux's affinity and counters.
func probeStalls(context.Context, string, time.Duration) ([]StallProbe, error) {
	return nil, errors.New("stall probe: Linux only")
}
