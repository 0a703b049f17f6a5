package fleet

import "time"

// StallWindow is how far back first-token times count toward an
// endpoint's p99: between one and two windows of completions, so a
// replica's limit follows its recent behaviour, not its whole life.
const StallWindow = time.Minute

// StallMinSamples is how many first-token times a p99 needs; an endpoint
// with fewer borrows its pool's.
const StallMinSamples = 20

// bucketCounts are one MsHistogram's bucket counts.
type bucketCounts [len(RequestBuckets) + 1]uint64

// stallWindow holds the cumulative first-token and TTFB counts at the last
// two rotations; the counts since the older one are the recent window.
// Owned by the stall check's goroutine (the decider's ticker).
type stallWindow struct {
	ft, tb    [2]bucketCounts
	rotatedNs int64
}

func (h *MsHistogram) load() bucketCounts {
	var c bucketCounts
	for i := range c {
		c[i] = h.Counts[i].Load()
	}
	return c
}

// RecentFirstToken returns the endpoint's first-token time counts of the
// last one to two StallWindows: the tft= times the proxies report, or the
// times to response headers (ttfb=) when none came (a proxy without
// first_token_timing). Only the stall check's goroutine may call it.
func (st *State) RecentFirstToken(now time.Time) (c [len(RequestBuckets) + 1]uint64, n uint64) {
	w := &st.Stall.window
	ft, tb := st.Feedback.FirstToken.load(), st.Feedback.TTFB.load()
	if nowNs := now.UnixNano(); nowNs-w.rotatedNs >= int64(StallWindow) {
		w.ft[0], w.ft[1] = w.ft[1], ft
		w.tb[0], w.tb[1] = w.tb[1], tb
		w.rotatedNs = nowNs
	}
	for _, src := range [2]struct{ cur, base *bucketCounts }{{&ft, &w.ft[0]}, {&tb, &w.tb[0]}} {
		n = 0
		for i := range c {
			c[i] = src.cur[i] - min(src.base[i], src.cur[i])
			n += c[i]
		}
		if n > 0 {
			return c, n
		}
	}
	return c, 0
}

// P99 is the 99th percentile of counts c (n in all), interpolated within
// its bucket as Prometheus' histogram_quantile does (the buckets are
// coarse: a bucket's bound can be 2.5x a time inside it); ok is false with
// fewer than StallMinSamples or when it lies past the last bound.
func P99(c *[len(RequestBuckets) + 1]uint64, n uint64) (time.Duration, bool) {
	if n < StallMinSamples {
		return 0, false
	}
	rank := 0.99 * float64(n)
	var seen uint64
	for i, v := range c {
		if float64(seen+v) >= rank && v > 0 {
			if i >= len(RequestBuckets) {
				return 0, false
			}
			lo := 0.0
			if i > 0 {
				lo = RequestBuckets[i-1]
			}
			sec := lo + (RequestBuckets[i]-lo)*(rank-float64(seen))/float64(v)
			return time.Duration(sec * float64(time.Second)), true
		}
		seen += v
	}
	return 0, false
}

// SetScaled sets the limit scaled to the replica's first-token times (0:
// unknown, the budget applies).
func (ss *StallState) SetScaled(d time.Duration) { ss.ScaledNs.Store(int64(d)) }

// Limit is the time to first byte the endpoint must meet (ns; 0 = stall
// detection off): its scaled limit, capped by the budget.
func (ss *StallState) Limit() int64 {
	b := ss.BudgetNs.Load()
	if s := ss.ScaledNs.Load(); s > 0 && s < b {
		return s
	}
	return b
}
