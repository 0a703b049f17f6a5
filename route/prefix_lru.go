package route

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
}

type lruNode struct {
	key        uint64
	prev, next int32
}

func newBlockLRU(capacity int) *blockLRU {
	l := &blockLRU{cap: capacity, m: make(map[uint64]int32), head: -1, tail: -1, free: -1}
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
	lo, hi := 1, len(blocks) // blocks[:lo] known cached; answer in [lo, hi]
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

// insert records blocks as cached, last first, so the first block ends up
// the most recent (a cache evicts a prefix's tail before its head).
func (l *blockLRU) insert(blocks []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(blocks) - 1; i >= 0; i-- {
		l.touch(blocks[i])
	}
}

func (l *blockLRU) touch(k uint64) {
	if i, ok := l.m[k]; ok {
		l.unlink(i)
		l.pushFront(i)
		return
	}
	var i int32
	switch {
	case l.free >= 0:
		i = l.free
		l.free = l.nodes[i].next
	case len(l.nodes) < l.cap:
		l.nodes = append(l.nodes, lruNode{})
		i = int32(len(l.nodes) - 1)
	default:
		i = l.tail
		l.unlink(i)
		delete(l.m, l.nodes[i].key)
	}
	l.nodes[i].key = k
	l.m[k] = i
	l.pushFront(i)
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
