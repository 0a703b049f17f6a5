package policy

import (
	"math/bits"
	"sync/atomic"
)

// sessionMemory remembers, per session hash, the endpoint (by pool index)
// this instance last placed the session on: a direct-mapped table of
// atomic words, high 48 bits of the hash as the tag and index+1 in the low
// 16 (0: empty). A lost entry (another session took the slot, a restart)
// only makes a session look new, which costs at most one placement by the
// tighter bound; it never sends a request where the ring and the bounds
// would not. Lock-free and allocation-free: one load per decision, one
// store when the placement changed.
type sessionMemory struct {
	slots []atomic.Uint64
	mask  uint64
}

const memIndexBits = 16

// newSessionMemory holds n sessions rounded up to a power of two; n <= 0:
// none (every lookup misses, every store is dropped).
func newSessionMemory(n int) sessionMemory {
	if n <= 0 {
		return sessionMemory{}
	}
	size := uint64(1) << bits.Len64(uint64(n-1))
	return sessionMemory{slots: make([]atomic.Uint64, size), mask: size - 1}
}

func (m *sessionMemory) on() bool { return m.slots != nil }

// lookup returns the endpoint index the session was last placed on; ok is
// false when the session is not remembered.
func (m *sessionMemory) lookup(h uint64) (idx int, ok bool) {
	v := m.slots[h&m.mask].Load()
	if v == 0 || v>>memIndexBits != h>>memIndexBits {
		return -1, false
	}
	return int(v&(1<<memIndexBits-1)) - 1, true
}

// store remembers the session on endpoint idx (writing only on a change,
// so a session that stays put does not bounce the cache line between cores).
func (m *sessionMemory) store(h uint64, idx int) {
	if idx+1 >= 1<<memIndexBits {
		return
	}
	v := h>>memIndexBits<<memIndexBits | uint64(idx+1)
	if s := &m.slots[h&m.mask]; s.Load() != v {
		s.Store(v)
	}
}

// carry copies prev's entries, moving each endpoint index to the endpoint
// of the same name in the new pool (remap[old] = new, -1: gone), so a
// reload or a discovery change does not make every session look new. A
// table of another size starts empty (the slot is part of the hash).
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
