package mock

import (
	"encoding/binary"
	"sync"
)

// KVEventSink receives vLLM-style KV cache events. Calls are made while the
// cache's lock is held, so events arrive in the exact order the cache changed;
// implementations must be quick and must not call back into the Cache. The
// slices passed in are freshly allocated and owned by the sink. Token ids
// are the external ids (see Cache.SetTokenIDOffset).
type KVEventSink interface {
	BlocksStored(blockHashes []uint64, parentHash uint64, hasParent bool, tokenIDs []uint32, blockSize int)
	BlocksRemoved(blockHashes []uint64)
	AllBlocksCleared()
}

const (
	fnv64Offset = 14695981039346656037
	fnv64Prime  = 1099511628211
)

// HashBlock is the engine block hash: FNV-1a 64 over the parent hash (0 for
// the first block) as 8 little-endian bytes followed by each token id as 4
// little-endian bytes. Chaining on the parent makes a block's identity depend
// on the whole prefix, like vLLM's.
func HashBlock(parent uint64, tokens []int32) uint64 {
	h := uint64(fnv64Offset)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	for _, c := range b {
		h ^= uint64(c)
		h *= fnv64Prime
	}
	for _, t := range tokens {
		u := uint32(t)
		for k := 0; k < 4; k++ {
			h ^= uint64(byte(u >> (8 * k)))
			h *= fnv64Prime
		}
	}
	return h
}

// BlockHashes returns the chained hashes of every full block of tokens.
func BlockHashes(tokens []int32, blockSize int) []uint64 {
	return appendBlockHashes(nil, 0, tokens, blockSize, len(tokens)/blockSize)
}

// AdapterKey is the cache key of a LoRA adapter's blocks ("": the base
// model, 0). vLLM hashes the adapter's name into every block
// (kv_cache_utils.py, the LoRA extra keys), so a prompt cached under one
// adapter is a miss for another and for the base model; the chain starts
// at this key instead of 0.
func AdapterKey(adapter string) uint64 {
	if adapter == "" {
		return 0
	}
	h := uint64(fnv64Offset)
	for i := 0; i < len(adapter); i++ {
		h ^= uint64(adapter[i])
		h *= fnv64Prime
	}
	return h
}

func appendBlockHashes(dst []uint64, parent uint64, tokens []int32, blockSize, n int) []uint64 {
	for i := 0; i < n; i++ {
		parent = HashBlock(parent, tokens[i*blockSize:(i+1)*blockSize])
		dst = append(dst, parent)
	}
	return dst
}

// lruNode lives in a preallocated slab and is linked by index so a cache of
// thousands of blocks creates no per-block garbage.
type lruNode struct {
	hash       uint64
	prev, next int32
}

// Cache simulates vLLM's prefix cache: full blocks of BlockSize tokens keyed
// by chained hashes, kept in an LRU of fixed capacity. Safe for concurrent use.
type Cache struct {
	mu        sync.Mutex
	blockSize int
	capacity  int
	index     map[uint64]int32
	nodes     []lruNode // nodes[0] is the list sentinel: next = MRU, prev = LRU
	free      []int32
	sink      KVEventSink
	idOffset  uint32 // added to every token id the sink sees

	// scratch buffers reused under mu
	hashes []uint64
	slots  []int32
}

// NewCache returns an empty cache of capacity blocks of blockSize tokens.
// Non-positive arguments fall back to 16 tokens / 4096 blocks.
func NewCache(blockSize, capacity int) *Cache {
	if blockSize <= 0 {
		blockSize = 16
	}
	if capacity <= 0 {
		capacity = 4096
	}
	c := &Cache{
		blockSize: blockSize,
		capacity:  capacity,
		index:     make(map[uint64]int32, capacity),
		nodes:     make([]lruNode, capacity+1),
		free:      make([]int32, 0, capacity),
	}
	c.resetLocked()
	return c
}

func (c *Cache) resetLocked() {
	clear(c.index)
	c.nodes[0] = lruNode{}
	c.free = c.free[:0]
	for i := c.capacity; i >= 1; i-- {
		c.free = append(c.free, int32(i))
	}
}

// SetSink installs (or with nil removes) the KV event sink.
func (c *Cache) SetSink(s KVEventSink) {
	c.mu.Lock()
	c.sink = s
	c.mu.Unlock()
}

// SetTokenIDOffset makes the sink see every token id plus off (mod 2^32),
// e.g. 1<<31 to emulate engines whose ids do not fit in int32. /tokenize
// must apply the same offset (Server does) so the ids agree.
func (c *Cache) SetTokenIDOffset(off uint32) {
	c.mu.Lock()
	c.idOffset = off
	c.mu.Unlock()
}

// BlockSize is the number of tokens per block.
func (c *Cache) BlockSize() int { return c.blockSize }

// Capacity is the maximum number of cached blocks.
func (c *Cache) Capacity() int { return c.capacity }

// Len is the number of blocks currently cached.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.index)
}

// Usage is Len/Capacity, vLLM's kv_cache_usage_perc (0..1).
func (c *Cache) Usage() float64 {
	return float64(c.Len()) / float64(c.capacity)
}

// Contains reports whether the block with this hash is cached.
func (c *Cache) Contains(hash uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.index[hash]
	return ok
}

// Blocks returns the cached block hashes from most to least recently used
// (the last one is evicted first).
func (c *Cache) Blocks() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]uint64, 0, len(c.index))
	for i := c.nodes[0].next; i != 0; i = c.nodes[i].next {
		out = append(out, c.nodes[i].hash)
	}
	return out
}

// numBlocks caps the considered blocks at capacity: a prompt longer than the
// whole cache can only keep its first blocks, and capping guarantees inserting
// a prompt never evicts its own blocks.
func (c *Cache) numBlocks(tokens []int32) int {
	return min(len(tokens)/c.blockSize, c.capacity)
}

// Lookup returns how many leading prompt tokens are cached, without touching
// the LRU.
func (c *Cache) Lookup(tokens []int32) (cachedTokens int) {
	n := c.numBlocks(tokens)
	c.mu.Lock()
	defer c.mu.Unlock()
	var parent uint64
	hits := 0
	for i := 0; i < n; i++ {
		parent = HashBlock(parent, tokens[i*c.blockSize:(i+1)*c.blockSize])
		if _, ok := c.index[parent]; !ok {
			break
		}
		hits++
	}
	return hits * c.blockSize
}

// Insert stores or touches all full blocks of tokens.
func (c *Cache) Insert(tokens []int32) {
	c.Serve(tokens)
}

// Serve is what the engine does for one request: count the longest run of
// cached leading blocks, then store/touch all the prompt's full blocks. It
// returns the cached token count (a multiple of BlockSize).
func (c *Cache) Serve(tokens []int32) (cachedTokens int) {
	return c.ServeKeyed(0, tokens)
}

// ServeKeyed is Serve for the blocks keyed by key (AdapterKey).
func (c *Cache) ServeKeyed(key uint64, tokens []int32) (cachedTokens int) {
	n := c.numBlocks(tokens)
	if n == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hashes = appendBlockHashes(c.hashes[:0], key, tokens, c.blockSize, n)
	hashes := c.hashes
	if cap(c.slots) < n {
		c.slots = make([]int32, n)
	}
	slots := c.slots[:n]

	hits, missing := 0, 0
	prefix := true
	for i, h := range hashes {
		idx, ok := c.index[h]
		if !ok {
			idx = 0
			missing++
			prefix = false
		} else if prefix {
			hits++
		}
		slots[i] = idx
	}

	// Pin the prompt's already-cached blocks at the MRU end first, so the
	// evictions below can only hit other prompts' blocks.
	for _, idx := range slots {
		if idx != 0 {
			c.moveToFront(idx)
		}
	}
	var evicted []uint64
	for range missing - len(c.free) {
		lru := c.nodes[0].prev
		h := c.nodes[lru].hash
		c.unlink(lru)
		delete(c.index, h)
		c.free = append(c.free, lru)
		if c.sink != nil {
			evicted = append(evicted, h)
		}
	}
	// Touch in reverse so block 0 ends up most recent and is evicted last:
	// a shared prefix outlives the suffixes hanging off it, like in vLLM.
	for i := n - 1; i >= 0; i-- {
		idx := slots[i]
		if idx == 0 {
			idx = c.free[len(c.free)-1]
			c.free = c.free[:len(c.free)-1]
			c.nodes[idx].hash = hashes[i]
			c.index[hashes[i]] = idx
			c.pushFront(idx)
			continue
		}
		c.moveToFront(idx)
	}

	if c.sink != nil {
		if len(evicted) > 0 {
			c.sink.BlocksRemoved(evicted)
		}
		if missing > 0 {
			c.emitStoredLocked(tokens, hashes, slots)
		}
	}
	return hits * c.blockSize
}

// emitStoredLocked reports newly stored blocks, one event per run of
// consecutive new blocks (normally exactly one: the suffix after the hits).
func (c *Cache) emitStoredLocked(tokens []int32, hashes []uint64, slots []int32) {
	bs := c.blockSize
	for a := 0; a < len(slots); {
		if slots[a] != 0 {
			a++
			continue
		}
		b := a
		for b < len(slots) && slots[b] == 0 {
			b++
		}
		var parent uint64
		if a > 0 {
			parent = hashes[a-1]
		}
		hs := append([]uint64(nil), hashes[a:b]...)
		toks := make([]uint32, 0, (b-a)*bs)
		for _, t := range tokens[a*bs : b*bs] {
			toks = append(toks, uint32(t)+c.idOffset)
		}
		c.sink.BlocksStored(hs, parent, a > 0, toks, bs)
		a = b
	}
}

// Reset empties the cache (vLLM's /reset_prefix_cache).
func (c *Cache) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resetLocked()
	if c.sink != nil {
		c.sink.AllBlocksCleared()
	}
}

func (c *Cache) unlink(i int32) {
	n := &c.nodes[i]
	c.nodes[n.prev].next = n.next
	c.nodes[n.next].prev = n.prev
	n.prev, n.next = 0, 0
}

func (c *Cache) pushFront(i int32) {
	head := c.nodes[0].next
	c.nodes[i].prev = 0
	c.nodes[i].next = head
	c.nodes[head].prev = i
	c.nodes[0].next = i
}

func (c *Cache) moveToFront(i int32) {
	if c.nodes[0].next == i {
		return
	}
	c.unlink(i)
	c.pushFront(i)
}
