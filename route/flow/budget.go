package flow

import "sync/atomic"

// budget bounds the bytes every held request keeps (its SPOE frame or
// HTTP body and headers) across a Set's controllers: limits.max_buffered_bytes.
// A request that would pass it is not held: its class sheds it or it is
// routed at once, as when its queue is full.
type budget struct {
	max  atomic.Int64 // 0: unbounded
	held atomic.Int64
}

// take reserves n bytes; false when they do not fit.
func (b *budget) take(n int64) bool {
	if b == nil {
		return true
	}
	max := b.max.Load()
	if max <= 0 {
		b.held.Add(n)
		return true
	}
	for {
		h := b.held.Load()
		if h+n > max {
			return false
		}
		if b.held.CompareAndSwap(h, h+n) {
			return true
		}
	}
}

// give returns n bytes taken.
func (b *budget) give(n int64) {
	if b != nil {
		b.held.Add(-n)
	}
}
