package kv

import "math/bits"

// The first-block holders: every entry of a block stored without a parent
// (the first block of a prompt) is linked, by slab index, into a list of
// the entries with its key, headed in Index.firsts. A request's keys are a
// chain from its first block, so only the sources in that list can hold
// any prefix of it: MatchFirst asks them alone instead of every source.
// The links live in the entries (8 bytes each), so linking and unlinking
// on store, remove, eviction and clear are O(1) and allocation-free.

// notFirst marks an entry that is in no first-block list.
const notFirst = -2

// linkFirst puts entry i at the head of its key's list.
func (ix *Index) linkFirst(i int32) {
	e := &ix.slab[i]
	ref, inserted := ix.firsts.ref(e.key)
	e.fprev, e.fnext = nilIdx, nilIdx
	if !inserted {
		h := int32(ref.val - 1)
		e.fnext = h
		ix.slab[h].fprev = i
	}
	ref.val = uint32(i) + 1
}

// unlinkFirst takes entry i out of its key's list, if it is in one.
func (ix *Index) unlinkFirst(i int32) {
	e := &ix.slab[i]
	if e.fprev == notFirst {
		return
	}
	switch {
	case e.fprev != nilIdx:
		ix.slab[e.fprev].fnext = e.fnext
	case e.fnext != nilIdx:
		ix.firsts.put(e.key, uint32(e.fnext)+1)
	default:
		ix.firsts.del(e.key)
	}
	if e.fnext != nilIdx {
		ix.slab[e.fnext].fprev = e.fprev
	}
	e.fprev, e.fnext = notFirst, nilIdx
}

// Matches is what MatchFirst found, by the caller's position of each
// source (e.g. an endpoint's index in its pool). Between lookups every
// figure is zero: Reset clears only what the last lookup set, so a
// lookup costs what its holders do, not what the pool's size does.
type Matches struct {
	// Blocks is how many leading keys the source at a position holds.
	Blocks []int
	// Stale is whether that source's events had a gap (Index.Stale).
	Stale []bool
	// Held has bit p set when position p holds the first block.
	Held []uint64
}

// Size makes room for positions [0, n), all zero.
func (m *Matches) Size(n int) {
	if cap(m.Blocks) < n {
		m.Blocks, m.Stale = make([]int, n), make([]bool, n)
		m.Held = make([]uint64, (n+63)/64)
		return
	}
	m.Reset()
	m.Blocks, m.Stale, m.Held = m.Blocks[:n], m.Stale[:n], m.Held[:(n+63)/64]
}

// Reset zeroes what the last lookup set.
func (m *Matches) Reset() {
	for w, b := range m.Held {
		for ; b != 0; b &= b - 1 {
			p := w<<6 | bits.TrailingZeros64(b)
			m.Blocks[p], m.Stale[p] = 0, false
		}
		m.Held[w] = 0
	}
}

// MatchFirst is MatchIDs for the sources holding keys[0]: for each such
// source id, at[id] is its position in m (negative or beyond at: not the
// caller's, skipped), where it gets its longest prefix of keys in blocks,
// its staleness and its bit in Held. m must be reset and sized for every
// position of at. It does not allocate.
func (ix *Index) MatchFirst(keys []uint64, at []int32, m *Matches) {
	if len(keys) == 0 {
		return
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	v, ok := ix.firsts.get(keys[0])
	if !ok {
		return
	}
	for i := int32(v - 1); i != nilIdx; i = ix.slab[i].fnext {
		id := ix.slab[i].src
		if int(id) >= len(at) || at[id] < 0 || int(at[id]) >= len(m.Blocks) {
			continue
		}
		p := int(at[id])
		if m.Held[p>>6]&(1<<(p&63)) != 0 {
			continue // one source's second entry of the same first block
		}
		s := ix.srcs[id]
		m.Held[p>>6] |= 1 << (p & 63)
		m.Blocks[p] = 1 + matchSource(s, keys[1:])
		m.Stale[p] = s.stale
	}
}
