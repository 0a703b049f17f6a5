package bench

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// pacedLoop runs conns workers of t for d at rate decisions per second in
// total (open loop): worker w sends its k-th request at start +
// (k*conns+w)/rate, or at once when it is behind. Latencies run from that
// intended send time, so a request the client sent late (its worker
// waiting on the last answer, or not scheduled) counts its delay.
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
	return targetLoop(ctx, t, conns, d, func(w int) time.Time {
		due := next[w]
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		next[w] = due.Add(gap)
		return due
	})
}

// pacedWorkers runs workers goroutines, each with its own fasthttp request
// and response and its own sender from newSend, that together make the
// i-th send at start + i/rate (open loop) until ctx ends.
func pacedWorkers(ctx context.Context, workers int, rate float64, newSend func() func(i int64, due time.Time, req *fasthttp.Request, resp *fasthttp.Response)) {
	var seq atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := newSend()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for {
				i := seq.Add(1) - 1
				due := start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
				if sleepCtx(ctx, time.Until(due)) != nil {
					return
				}
				send(i, due, req, resp)
			}
		}()
	}
	wg.Wait()
}
