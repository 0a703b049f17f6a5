// Package tick runs a function on a ticker until the function is done or
// its context ends: the polling loop of watchers that wait for something
// to come up or keep a status current.
package tick

import (
	"context"
	"time"
)

// Every calls fn every d, the first time d after the call, until fn
// returns false or ctx ends (fn is not called once ctx has ended). It
// returns when either happens.
func Every(ctx context.Context, d time.Duration, fn func(context.Context) bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil || !fn(ctx) {
			return
		}
	}
}
