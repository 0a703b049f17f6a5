package policy

import (
	"math/bits"
	"sync/atomic"

	"github.com/turnout/turnout/route/fleet"
)

// lastSent remembers, per prompt, the endpoint that was sent it last
// (here or, through the sync, by a peer), keyed by the prompt's last
// hashed block. Several replicas hold the whole hashed part of a
// conversation once a turn has moved (the hash covers only the first
// route_body bytes, which later turns share whole), and each front reads
// their loads at another age; the replica the last turn went to is the one
// whose engine cache holds the latest turn, so a tie goes there on every
// front alike.
//
// A direct-mapped table of one word per slot: the key's upper 48 bits and
// the endpoint index + 1 (lastIndexBits). A collision overwrites an older
// prompt, whose next tie then falls back to the other tie-breakers. Lock
// free: the decision path and the sync write it at once.
type lastSent struct {
	slots []atomic.Uint64
	mask  uint64
}

// lastIndexBits are the low bits of a slot that hold the endpoint index +
// 1; pools larger than that are not tracked (their ties fall through).
const lastIndexBits = 16

// Table bounds: about one slot per 16 blocks the pool's LRUs hold.
const (
	lastMinSlots = 1 << 10
	lastMaxSlots = 1 << 20
)

// newLastSent sizes the table for endpoints LRUs of capacity blocks each.
func newLastSent(endpoints, capacity int) *lastSent {
	n := min(max(endpoints*capacity/16, lastMinSlots), lastMaxSlots)
	n = 1 << bits.Len(uint(n-1)) // a power of two
	return &lastSent{slots: make([]atomic.Uint64, n), mask: uint64(n - 1)}
}

// put records that the prompt ending in block k went to endpoint i.
func (t *lastSent) put(k uint64, i int) {
	if i < 0 || i >= 1<<lastIndexBits-1 {
		return
	}
	t.slots[k&t.mask].Store(k&^(1<<lastIndexBits-1) | uint64(i+1))
}

// get is the endpoint the prompt ending in block k went to last, -1 when
// not known.
func (t *lastSent) get(k uint64) int {
	v := t.slots[k&t.mask].Load()
	if v == 0 || (v^k)>>lastIndexBits != 0 {
		return -1
	}
	return int(v&(1<<lastIndexBits-1)) - 1
}

// LastSent breaks ties among endpoints holding the same prefix toward the
// one the prompt ending there was sent to last (the conversation's last
// turn). Only meaningful in the index's own keyed picker, where equal
// scores are equal matches.
type LastSent struct{ X *PrefixIndex }

// Key implements Tie: 1 for the endpoint that last got the matched
// prefix, 0 for the others.
func (l LastSent) Key(c *Cycle, e *fleet.Endpoint) uint64 {
	t := l.X.last
	if t == nil {
		return 0
	}
	m := l.X.lrus[e.Index].matchLen(c.Req.Blocks)
	if m == 0 || t.get(c.Req.Blocks[m-1]) != e.Index {
		return 0
	}
	return 1
}

// Signals implements fleet.Consumer: the index's own memory, no endpoint
// signal.
func (LastSent) Signals() fleet.Signals { return 0 }

var _ Tie = LastSent{}
