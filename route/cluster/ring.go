package cluster

import (
	"sync/atomic"

	"github.com/turnout/turnout/route/fleet"
)

// ring hands decisions from the decision path (many producers) to the
// publisher (one consumer): Dmitry Vyukov's bounded MPMC queue
// (1024cores.net, "Bounded MPMC queue") with a single consumer, its slots
// holding the decisions in place.
//
// Written here rather than taken from a library: the Go queues found box
// values in interfaces or pass pointers, and a decision's blocks must be
// copied into memory the queue owns without allocating. It replaces two
// buffered channels (a free list and a queue): each channel operation takes
// the channel's lock, which the publisher took too while draining, and a
// decision made two of them. Here a decision costs one compare-and-swap on
// the producers' cursor and one store on its slot; the consumer's cursor is
// plain memory on its own cache line and the consumer never writes the
// producers' line.
type ring struct {
	_     [64]byte
	tail  atomic.Uint64 // next position to claim (producers)
	_     [56]byte
	head  uint64 // next position to read (consumer only)
	_     [56]byte
	mask  uint64
	slots []slot
}

// slot is one decision. seq tells its state for position pos (pos & mask
// == its index): pos = free for the producer claiming pos, pos+1 = written
// and ready for the consumer, pos+len = released for the next lap.
type slot struct {
	seq    atomic.Uint64
	pool   *fleet.Pool
	ep     *fleet.Endpoint
	blocks []uint64
	_      [16]byte // one slot per cache line: producers filling neighbours do not share one
}

// newRing returns a ring of at least n slots (a power of two), each with a
// block buffer of blockCap.
func newRing(n, blockCap int) *ring {
	size := 1
	for size < n {
		size <<= 1
	}
	r := &ring{mask: uint64(size - 1), slots: make([]slot, size)}
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
		r.slots[i].blocks = make([]uint64, 0, blockCap)
	}
	return r
}

// put copies one decision into a free slot; false when the ring is full.
// Never blocks; allocates only when blocks is longer than any decision the
// slot held before.
func (r *ring) put(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64) bool {
	pos := r.tail.Load()
	for {
		s := &r.slots[pos&r.mask]
		switch d := int64(s.seq.Load() - pos); {
		case d == 0:
			if !r.tail.CompareAndSwap(pos, pos+1) {
				pos = r.tail.Load()
				continue
			}
			s.pool, s.ep = p, e
			s.blocks = append(s.blocks[:0], blocks...)
			s.seq.Store(pos + 1) // publishes the writes above to the consumer
			return true
		case d < 0:
			return false // the consumer has not released this slot's last lap
		default:
			pos = r.tail.Load() // another producer claimed pos
		}
	}
}

// peek returns the next written slot, or nil when there is none yet (empty,
// or the next producer is still copying: it is read on the next drain).
// Consumer only; release the slot after use.
func (r *ring) peek() *slot {
	s := &r.slots[r.head&r.mask]
	if s.seq.Load() != r.head+1 {
		return nil
	}
	return s
}

// release frees the slot peek returned for the producers' next lap.
func (r *ring) release(s *slot) {
	s.pool, s.ep = nil, nil // old snapshots are not kept alive by the ring
	s.seq.Store(r.head + r.mask + 1)
	r.head++
}

// claimed is the number of positions producers have claimed so far.
func (r *ring) claimed() uint64 { return r.tail.Load() }
