package bench

import (
	"context"
	"errors"
	"time"
)

// pacedLoop runs conns workers of t for d at rate decisions per second in
// total (open loop): worker w sends its k-th request at start +
// (k*conns+w)/rate, or at once when it is behind. Latencies run from the
// send, so they are the transport's answer times at that load.
func pacedLoop(ctx context.Context, t transportTarget, conns int, rate float64, d time.Duration) (*LoadResult, error) {
	if rate <= 0 || conns < 1 {
		return nil, errors.New("paced: rate and conns must be positive")
	}
	start := time.Now()
	next := make([]time.Time, conns)
	for w := range next {
		next[w] = start.Add(time.Duration(float64(time.Second) * float64(w) / rate))
	}
	gap := time.Duration(float64(time.Second) * float64(conns) / rate)
	return targetLoop(ctx, t, conns, d, func(w int) {
		if wait := time.Until(next[w]); wait > 0 {
			time.Sleep(wait)
		}
		next[w] = next[w].Add(gap)
	})
}
