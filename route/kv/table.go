package kv

import "math/bits"

// table is an open-addressing hash table (linear probing) from uint64 keys
// to non-zero uint32 values, the index's per-source maps. Ingest is bound
// by their cache misses: a key and its value share a 16-byte slot, so one
// probe usually touches one cache line, and a read-modify-write (count a
// key up or down, look up then insert) is one probe where a Go map takes
// two. A value of 0 marks an empty slot; deletion shifts the probe run
// back, so there are no tombstones. The zero table is empty and usable.
type table struct {
	slots []slot
	n     int
	shift uint8  // 64 - log2(len(slots))
	seed  uint64 // per table, so an engine's hash values cannot pick our collisions
}

type slot struct {
	key uint64
	val uint32
}

const (
	minTableSlots = 16
	slotBytes     = 16
)

func newTable(seed uint64) table { return table{seed: seed} }

// home is k's first slot: the seeded key through a 64-bit finalizer
// (murmur3's fmix64), top bits, so sequential engine hashes spread.
func (t *table) home(k uint64) int {
	k ^= t.seed
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return int(k >> t.shift)
}

// find returns k's slot, or the empty slot that ends its probe run.
func (t *table) find(k uint64) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.val == 0 {
			return i, false
		}
		if s.key == k {
			return i, true
		}
	}
}

// get returns k's value, 0 when absent.
func (t *table) get(k uint64) (uint32, bool) {
	i, ok := t.find(k)
	if !ok {
		return 0, false
	}
	return t.slots[i].val, true
}

// has reports whether k is present.
func (t *table) has(k uint64) bool {
	_, ok := t.find(k)
	return ok
}

// ref returns k's slot, inserting k with value 0 (which the caller must
// set non-zero before the next operation) when absent.
func (t *table) ref(k uint64) (s *slot, inserted bool) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	i, ok := t.find(k)
	if !ok {
		t.slots[i].key = k
		t.n++
	}
	return &t.slots[i], !ok
}

// put sets k's value (v != 0).
func (t *table) put(k uint64, v uint32) {
	s, _ := t.ref(k)
	s.val = v
}

// inc counts k up by one.
func (t *table) inc(k uint64) {
	s, _ := t.ref(k)
	s.val++
}

// dec counts k down by one, removing it at 0.
func (t *table) dec(k uint64) {
	i, ok := t.find(k)
	if !ok {
		return
	}
	if t.slots[i].val > 1 {
		t.slots[i].val--
		return
	}
	t.deleteAt(i)
}

// del removes k.
func (t *table) del(k uint64) {
	if i, ok := t.find(k); ok {
		t.deleteAt(i)
	}
}

// deleteAt empties slot i and moves later entries of its probe run back
// into the gap, as far as each one's home allows.
func (t *table) deleteAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].val != 0; j = (j + 1) & mask {
		// The entry at j may fill the gap at i if i lies on its probe
		// path: no farther from j than its home is.
		if (j-t.home(t.slots[j].key))&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

func (t *table) grow() {
	old := t.slots
	size := max(minTableSlots, 2*len(old))
	t.slots = make([]slot, size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := size - 1
	for _, s := range old {
		if s.val == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].val != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// each calls f with every value.
func (t *table) each(f func(v uint32)) {
	for _, s := range t.slots {
		if s.val != 0 {
			f(s.val)
		}
	}
}

// bytes is the table's memory.
func (t *table) bytes() int64 { return int64(len(t.slots)) * slotBytes }
