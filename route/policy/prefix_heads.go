package policy

import "sync"

// headIndex answers, once per request, which endpoints of a pool can hold
// any of its prefix: a prompt's blocks are chained hashes, so only an
// endpoint whose LRU holds the prompt's first block can match at all, and
// a request's key needs one lookup here instead of one lock and lookup per
// endpoint's LRU (the scan that made a 256-endpoint pool four times a
// 16-endpoint one). Rows are bitsets by endpoint index in one slab, so
// steady state adds and removes do not allocate.
type headIndex struct {
	mu    sync.RWMutex
	words int              // uint64s per row
	at    map[uint64]int32 // first block -> row
	rows  []uint64         // len(at) rows (and free ones) of words each
	free  []int32
	count []int32 // endpoints set in each row
}

func newHeadIndex(endpoints int) *headIndex {
	return &headIndex{words: (endpoints + 63) / 64, at: map[uint64]int32{}}
}

// add marks endpoint i as holding first block k. Called under i's LRU lock.
func (h *headIndex) add(k uint64, i int32) {
	h.mu.Lock()
	r, ok := h.at[k]
	if !ok {
		if n := len(h.free); n > 0 {
			r, h.free = h.free[n-1], h.free[:n-1]
		} else {
			r = int32(len(h.count))
			h.rows = append(h.rows, make([]uint64, h.words)...)
			h.count = append(h.count, 0)
		}
		h.at[k] = r
	}
	w := &h.rows[int(r)*h.words+int(i>>6)]
	if *w&(1<<(i&63)) == 0 {
		*w |= 1 << (i & 63)
		h.count[r]++
	}
	h.mu.Unlock()
}

// remove clears endpoint i from first block k's row. Called under i's
// LRU lock.
func (h *headIndex) remove(k uint64, i int32) {
	h.mu.Lock()
	if r, ok := h.at[k]; ok {
		h.unset(k, r, i)
	}
	h.mu.Unlock()
}

// unset clears endpoint i from row r (first block k), freeing the row when
// it was the last holder. Under mu.
func (h *headIndex) unset(k uint64, r, i int32) {
	w := &h.rows[int(r)*h.words+int(i>>6)]
	if *w&(1<<(i&63)) == 0 {
		return
	}
	*w &^= 1 << (i & 63)
	if h.count[r]--; h.count[r] == 0 {
		delete(h.at, k)
		h.free = append(h.free, r)
	}
}

// holders copies first block k's row into dst (len >= words) and reports
// whether any endpoint holds it.
func (h *headIndex) holders(k uint64, dst []uint64) bool {
	h.mu.RLock()
	r, ok := h.at[k]
	if ok {
		copy(dst, h.rows[int(r)*h.words:int(r+1)*h.words])
	}
	h.mu.RUnlock()
	return ok
}

// bind makes l endpoint i's LRU of this index: what l holds is marked, and
// l reports its first blocks here from now on (a carried or forgotten
// endpoint's old marks are cleared first by the caller).
func (h *headIndex) bind(l *blockLRU, i int32) {
	l.mu.Lock()
	l.heads, l.slot = h, i
	for k := range l.firsts {
		h.add(k, i)
	}
	l.mu.Unlock()
}

// clear removes endpoint i from every row (an endpoint forgotten).
func (h *headIndex) clear(i int32) {
	h.mu.Lock()
	for k, r := range h.at {
		h.unset(k, r, i)
	}
	h.mu.Unlock()
}
