package policy

import "sync"

// blockLRU is one endpoint's approximate prefix cache: a bounded set of block
// hashes with LRU eviction. Slab + intrusive list + a pre-sized map, so steady
// state inserts and lookups do not allocate.
type blockLRU struct {
	mu    sync.Mutex
	cap   int
	m     map[uint64]int32
	nodes []lruNode
	head  int32 // most recent; -1 when empty
	tail  int32
	free  int32
	// heads, when set, learns which first blocks (a prompt's blocks[0])
	// this endpoint (slot) holds; firsts are they.
	heads  *headIndex
	slot   int32
	firsts map[uint64]struct{}
}

type lruNode struct {
	key        uint64
	prev, next int32
}

func newBlockLRU(capacity int) *blockLRU {
	l := &blockLRU{cap: capacity, m: make(map[uint64]int32), head: -1, tail: -1, free: -1, firsts: map[uint64]struct{}{}}
	return l
}

// Len is the number of cached blocks.
func (l *blockLRU) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// matchLen returns how many leading blocks are cached. Entries are touched
// in reverse order on insert, so a cached block's predecessors are cached
// too (up to approximation) and a binary search finds the boundary.
func (l *blockLRU) matchLen(blocks []uint64) int {
	if len(blocks) == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[blocks[0]]; !ok {
		return 0
	}
	return l.search(blocks, 1)
}

// search returns how many leading blocks are cached, blocks[:lo] known to
// be (binary search over [lo, len(blocks)]; l.mu held).
func (l *blockLRU) search(blocks []uint64, lo int) int {
	hi := len(blocks)
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if _, ok := l.m[blocks[mid-1]]; ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// matchAtLeast is matchLen for a caller that only uses lengths of at least
// floor: matchLen's answer when that is floor or more, 0 otherwise. A block
// is only ever cached with its predecessors (hashes are chained, and an
// insert touches a block's predecessor after it), so one lookup of
// blocks[floor-1] tells which, and the search starts there: two lookups
// for a prompt matched exactly as far as the best so far.
func (l *blockLRU) matchAtLeast(blocks []uint64, floor int) int {
	if floor <= 1 {
		return l.matchLen(blocks)
	}
	if floor > len(blocks) {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[blocks[floor-1]]; !ok {
		return 0
	}
	if floor == len(blocks) {
		return floor
	}
	if _, ok := l.m[blocks[floor]]; !ok {
		return floor
	}
	return l.search(blocks, floor+1)
}

// insert records blocks as cached, last first, so the first block ends up
// the most recent (a cache evicts a prefix's tail before its head).
func (l *blockLRU) insert(blocks []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.extendHead(blocks) {
		for i := len(blocks) - 1; i >= 0; i-- {
			l.touch(blocks[i])
		}
	}
	if len(blocks) > 0 {
		if _, ok := l.firsts[blocks[0]]; !ok {
			l.firsts[blocks[0]] = struct{}{}
			if l.heads != nil {
				l.heads.add(blocks[0], l.slot)
			}
		}
	}
}

// maxExtend bounds the new blocks extendHead places (it compares each with
// the blocks before it).
const maxExtend = 8

// extendHead is insert's common case without a map operation per block:
// the list already starts with blocks[:p] (this prefix was the last one
// inserted here, as on a conversation's next turn) and at most maxExtend
// blocks follow, none a repeat and none needing an eviction. It leaves the
// list, the map and the node slots exactly as touching every block last
// first would, and reports false, changing nothing, in any other case.
func (l *blockLRU) extendHead(blocks []uint64) bool {
	p, last := 0, int32(-1)
	for i := l.head; i >= 0 && p < len(blocks) && l.nodes[i].key == blocks[p]; i = l.nodes[i].next {
		p, last = p+1, i
	}
	rest := blocks[p:]
	if p == 0 || len(rest) > maxExtend {
		return false
	}
	room := l.cap - len(l.nodes)
	for j, k := range rest {
		for _, b := range blocks[:p+j] {
			if b == k {
				return false // a repeat: touch's order rules apply
			}
		}
		if _, ok := l.m[k]; !ok {
			if room--; room < 0 {
				return false // touch would evict
			}
		}
	}
	// Take nodes (cached ones unlinked, new ones allocated) in touch's
	// order, last first, then link them after blocks[:p] in order.
	var idx [maxExtend]int32
	for j := len(rest) - 1; j >= 0; j-- {
		i, ok := l.m[rest[j]]
		if ok {
			l.unlink(i)
		} else {
			i = l.alloc()
			l.nodes[i].key = rest[j]
			l.m[rest[j]] = i
		}
		idx[j] = i
	}
	for _, i := range idx[:len(rest)] {
		l.linkAfter(last, i)
		last = i
	}
	return true
}

func (l *blockLRU) touch(k uint64) {
	if i, ok := l.m[k]; ok {
		l.unlink(i)
		l.pushFront(i)
		return
	}
	var i int32
	if l.free >= 0 || len(l.nodes) < l.cap {
		i = l.alloc()
	} else {
		i = l.tail
		l.unlink(i)
		old := l.nodes[i].key
		delete(l.m, old)
		if _, ok := l.firsts[old]; ok {
			delete(l.firsts, old)
			if l.heads != nil {
				l.heads.remove(old, l.slot)
			}
		}
	}
	l.nodes[i].key = k
	l.m[k] = i
	l.pushFront(i)
}

// alloc takes a free node slot; the caller has checked there is one.
func (l *blockLRU) alloc() int32 {
	if i := l.free; i >= 0 {
		l.free = l.nodes[i].next
		return i
	}
	l.nodes = append(l.nodes, lruNode{})
	return int32(len(l.nodes) - 1)
}

// linkAfter links the unlinked node i after node prev (>= 0).
func (l *blockLRU) linkAfter(prev, i int32) {
	n := &l.nodes[i]
	n.prev, n.next = prev, l.nodes[prev].next
	if n.next >= 0 {
		l.nodes[n.next].prev = i
	} else {
		l.tail = i
	}
	l.nodes[prev].next = i
}

func (l *blockLRU) unlink(i int32) {
	n := &l.nodes[i]
	if n.prev >= 0 {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
}

func (l *blockLRU) pushFront(i int32) {
	n := &l.nodes[i]
	n.prev = -1
	n.next = l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}
