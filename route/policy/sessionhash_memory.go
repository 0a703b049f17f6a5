package policy

import (
	"math/bits"
	"sync/atomic"
)

// sessionMemory remembers, per session hash, the endpoint (by pool index)
// this instance last placed the session on: a table of atomic words in
// buckets of memWays, the bucket chosen by the hash's low bits, each word
// the high 48 bits of the hash as the tag and index+1 in the low 16 (0:
// empty). Buckets, not one slot per hash, so that two live sessions whose
// hashes share a slot do not evict each other: with one slot each, 400
// sessions in 65,536 slots already had a pair that did, and the evicted
// session, looking new, was moved off a replica that was not overloaded.
// A lost entry (a full bucket, a restart) only makes a session look new,
// which costs at most one placement by the tighter bound; it never sends a
// request where the ring and the bounds would not. Lock-free and
// allocation-free: up to memWays loads in one cache line per decision, one
// store when the placement changed.
type sessionMemory struct {
	slots []atomic.Uint64
	mask  uint64 // bucket index mask
}

const (
	memIndexBits = 16
	memWays      = 4 // 32 bytes: a bucket never straddles a 64-byte line
)

// newSessionMemory holds n sessions rounded up to a power of two (at least
// one bucket); n <= 0: none (every lookup misses, every store is dropped).
func newSessionMemory(n int) sessionMemory {
	if n <= 0 {
		return sessionMemory{}
	}
	size := max(uint64(1)<<bits.Len64(uint64(n-1)), memWays)
	return sessionMemory{slots: make([]atomic.Uint64, size), mask: size/memWays - 1}
}

func (m *sessionMemory) on() bool { return m.slots != nil }

func (m *sessionMemory) bucket(h uint64) []atomic.Uint64 {
	b := (h & m.mask) * memWays
	return m.slots[b : b+memWays : b+memWays]
}

// lookup returns the endpoint index the session was last placed on; ok is
// false when the session is not remembered.
func (m *sessionMemory) lookup(h uint64) (idx int, ok bool) {
	tag := h >> memIndexBits
	b := m.bucket(h)
	for i := range b {
		if v := b[i].Load(); v != 0 && v>>memIndexBits == tag {
			return int(v&(1<<memIndexBits-1)) - 1, true
		}
	}
	return -1, false
}

// store remembers the session on endpoint idx: in its own word if it has
// one (written only on a change, so a session that stays put does not
// bounce the cache line between cores), else in an empty word, else over
// the word its hash names (a full bucket loses one session).
func (m *sessionMemory) store(h uint64, idx int) {
	if idx+1 >= 1<<memIndexBits {
		return
	}
	tag := h >> memIndexBits
	v := tag<<memIndexBits | uint64(idx+1)
	b := m.bucket(h)
	empty := -1
	for i := range b {
		old := b[i].Load()
		switch {
		case old != 0 && old>>memIndexBits == tag:
			if old != v {
				b[i].Store(v)
			}
			return
		case old == 0 && empty < 0:
			empty = i
		}
	}
	if empty >= 0 && b[empty].CompareAndSwap(0, v) {
		return
	}
	b[tag%memWays].Store(v)
}

// carry copies prev's entries, moving each endpoint index to the endpoint
// of the same name in the new pool (remap[old] = new, -1: gone), so a
// reload or a discovery change does not make every session look new. A
// table of another size starts empty (the bucket is part of the hash).
func (m *sessionMemory) carry(prev *sessionMemory, remap []int) {
	if len(m.slots) != len(prev.slots) {
		return
	}
	for i := range prev.slots {
		v := prev.slots[i].Load()
		old := int(v&(1<<memIndexBits-1)) - 1
		if v == 0 || old >= len(remap) || remap[old] < 0 || remap[old]+1 >= 1<<memIndexBits {
			continue
		}
		m.slots[i].Store(v>>memIndexBits<<memIndexBits | uint64(remap[old]+1))
	}
}
