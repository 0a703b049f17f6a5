package kv

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"sync"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// BlockKeys appends to dst[:0] turnout's chained key of every full block of
// tokens: key_i = xxhash64(seed=key_{i-1}, little-endian int32 tokens of
// block i; see TokenID), seed 0 for block 0. The keys depend only on token ids, not on
// vLLM's hash algorithm or PYTHONHASHSEED, so the router can compute them
// for a prompt and match them against any replica's events. It does not
// allocate when dst has enough capacity.
func BlockKeys(tokens []uint32, blockSize int, dst []uint64) []uint64 {
	dst = dst[:0]
	if blockSize <= 0 {
		return dst
	}
	var prev uint64
	for len(tokens) >= blockSize {
		prev = chainKey(prev, tokens[:blockSize])
		dst = append(dst, prev)
		tokens = tokens[blockSize:]
	}
	return dst
}

// chainKey hashes one block's tokens seeded with its parent's key.
func chainKey(seed uint64, block []uint32) uint64 {
	var d xxhash.Digest
	var buf [512]byte
	d.ResetWithSeed(seed)
	for len(block) > 0 {
		n := min(len(block), len(buf)/4)
		for i, t := range block[:n] {
			binary.LittleEndian.PutUint32(buf[i*4:], t)
		}
		_, _ = d.Write(buf[:n*4])
		block = block[n:]
	}
	return d.Sum64()
}

// entry is one (source, engine block) in the slab. Entries are linked in a
// global LRU list by slab index so lookups and evictions never allocate.
type entry struct {
	key    uint64 // turnout's chained key
	engine uint64 // vLLM's block hash, normalized
	src    int32
	refs   uint32 // stores minus removes: vLLM may cache duplicate blocks under one hash
	prev   int32
	next   int32
	// fprev and fnext link the entries of one first block (firsts.go);
	// fprev is notFirst for an entry of a later block.
	fprev int32
	fnext int32
}

const nilIdx = -1

type source struct {
	name     string
	id       int32
	byEngine table // engine hash -> slab index + 1
	byKey    table // our key -> number of entries holding it
	stale    bool
	group    int // KV-cache group indexed for this source, -1 until seen
}

// Index maps turnout block keys to the replicas (sources) that hold them,
// for one deployment pool. It is safe for concurrent use; Match, MatchIDs
// and MatchFirst take only a read lock and do not allocate.
//
// Only events about device memory (medium absent or "GPU") of one
// full-attention KV-cache group per source are indexed: offloaded tiers and
// the other groups of hybrid models (sliding window, mamba) send their own
// store/remove streams for the same hashes, and merging them would let one
// tier's eviction hide another's copy. The group is the first one whose
// stores say kv_cache_spec_kind is full attention (group 0 when vLLM sends
// group_idx without a kind; any event when it sends neither). Blocks whose
// hash covers more than tokens (LoRA, multimodal, cache_salt) are skipped,
// as their token ids would match unrelated prompts.
type Index struct {
	mu     sync.RWMutex
	max    int
	slab   []entry
	free   int32 // free list through entry.next
	head   int32 // most recently stored
	tail   int32
	n      int
	byName map[string]int32
	srcs   []*source // by id; nil once removed, ids are never reused
	firsts table     // a first block's key -> its most recent entry's slab index + 1 (firsts.go)

	blockSize int // learned from the first stored event unless set

	evictions      uint64
	orphans        uint64
	misaligned     uint64
	filtered       uint64
	unknownRemoves uint64
}

// NewIndex returns an index holding at most maxBlocks (source, block)
// entries; beyond that the least recently stored entry is evicted.
func NewIndex(maxBlocks int) *Index {
	if maxBlocks < 1 {
		maxBlocks = 1
	}
	return &Index{
		max:    maxBlocks,
		free:   nilIdx,
		head:   nilIdx,
		tail:   nilIdx,
		byName: make(map[string]int32),
		firsts: newTable(rand.Uint64()),
	}
}

// BlockSize is the pool's block size in tokens (0 until known); callers
// pass it to BlockKeys.
func (ix *Index) BlockSize() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.blockSize
}

// SetBlockSize fixes the block size instead of learning it from the first
// event. Changing it drops every entry, as all keys depend on it.
func (ix *Index) SetBlockSize(n int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if n == ix.blockSize {
		return
	}
	ix.blockSize = n
	for _, s := range ix.srcs {
		if s != nil {
			ix.clearLocked(s)
		}
	}
}

// LearnBlockSize sets the block size when none is known yet (from the
// engine's own config, before its first event); a known size is kept.
func (ix *Index) LearnBlockSize(n int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.blockSize == 0 && n > 0 {
		ix.blockSize = n
	}
}

// SourceID registers name if needed and returns its id for MatchIDs. The id
// stays valid until RemoveSource(name); a later re-add gets a new id.
func (ix *Index) SourceID(name string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return int(ix.sourceLocked(name).id)
}

func (ix *Index) sourceLocked(name string) *source {
	if id, ok := ix.byName[name]; ok {
		return ix.srcs[id]
	}
	s := &source{
		name:     name,
		id:       int32(len(ix.srcs)),
		byEngine: newTable(rand.Uint64()),
		byKey:    newTable(rand.Uint64()),
		group:    -1,
	}
	ix.srcs = append(ix.srcs, s)
	ix.byName[name] = s.id
	return s
}

func (ix *Index) lookupLocked(name string) *source {
	if id, ok := ix.byName[name]; ok {
		return ix.srcs[id]
	}
	return nil
}

// Apply folds a batch of src's events into the index.
func (ix *Index) Apply(src string, b Batch) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.sourceLocked(src)
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case EventBlockStored:
			ix.storeLocked(s, ev)
		case EventBlockRemoved:
			ix.removeLocked(s, ev)
		case EventAllBlocksCleared:
			// The replica's cache is empty, so our view is exact again.
			ix.clearLocked(s)
			s.stale = false
		}
	}
}

func (s *source) tracked(ev *Event) bool {
	if ev.Medium != "" && !strings.EqualFold(ev.Medium, MediumGPU) {
		return false
	}
	if !ev.HasGroup {
		return true
	}
	if s.group >= 0 {
		return ev.GroupIdx == s.group
	}
	if ev.Kind == EventBlockStored && prefixReusable(ev.SpecKind, ev.GroupIdx) {
		s.group = ev.GroupIdx
		return true
	}
	return false // nothing held yet for this group's removals to touch
}

// prefixReusable reports whether a group of this kind caches whole
// prefixes, so a held block means the whole prefix up to it is cached.
func prefixReusable(kind string, group int) bool {
	switch kind {
	case "":
		return group == 0
	case specFullAttention, "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

func (ix *Index) storeLocked(s *source, ev *Event) {
	if !s.tracked(ev) || ev.HasLoraID || ev.LoraName != "" {
		ix.filtered++
		return
	}
	n, bs := len(ev.BlockHashes), ev.BlockSize
	if n == 0 {
		return
	}
	// Without one token block per hash (e.g. null blocks of sliding-window
	// groups) hashes and tokens cannot be paired.
	if bs <= 0 || len(ev.TokenIDs) != n*bs {
		ix.misaligned++
		return
	}
	if ix.blockSize == 0 {
		ix.blockSize = bs
	} else if bs != ix.blockSize {
		ix.misaligned++
		return
	}
	var key uint64
	if ev.HasParent {
		pi, ok := s.byEngine.get(ev.ParentHash)
		if !ok {
			// Parent unknown (joined late, lost events, evicted, or a
			// skipped block): the chain's token prefix is unknown.
			ix.orphans++
			return
		}
		key = ix.slab[pi-1].key
	}
	for j := range n {
		if j < len(ev.ExtraKeys) && ev.ExtraKeys[j] {
			// Its descendants (here and in later events) become orphans.
			ix.filtered++
			return
		}
		key = chainKey(key, ev.TokenIDs[j*bs:(j+1)*bs])
		ix.upsertLocked(s, ev.BlockHashes[j], key, j == 0 && !ev.HasParent)
	}
}

// upsertLocked stores one block; first: it begins a prompt (no parent).
func (ix *Index) upsertLocked(s *source, engine, key uint64, first bool) {
	if ix.n >= ix.max {
		if v, ok := s.byEngine.get(engine); ok {
			ix.restoreLocked(s, int32(v-1), key, first)
			return
		}
		// Before the insert below: evicting may delete from this table.
		ix.evictLocked()
	}
	ref, inserted := s.byEngine.ref(engine)
	if !inserted {
		ix.restoreLocked(s, int32(ref.val-1), key, first)
		return
	}
	var i int32
	if ix.free != nilIdx {
		i = ix.free
		ix.free = ix.slab[i].next
	} else {
		ix.slab = append(ix.slab, entry{})
		i = int32(len(ix.slab) - 1)
	}
	ref.val = uint32(i) + 1
	ix.slab[i] = entry{key: key, engine: engine, src: s.id, refs: 1, prev: nilIdx, next: nilIdx, fprev: notFirst}
	ix.pushFront(i)
	ix.n++
	s.byKey.inc(key)
	if first {
		ix.linkFirst(i)
	}
}

// restoreLocked is a store of a block src already holds (slab index i).
func (ix *Index) restoreLocked(s *source, i int32, key uint64, first bool) {
	e := &ix.slab[i]
	if e.key != key {
		// Same engine hash, different tokens: trust the newest event.
		ix.unlinkFirst(i)
		s.byKey.dec(e.key)
		e.key = key
		s.byKey.inc(key)
		e.refs = 0
	}
	if first && e.fprev == notFirst {
		ix.linkFirst(i)
	}
	e.refs++
	ix.unlink(i)
	ix.pushFront(i)
}

func (ix *Index) removeLocked(s *source, ev *Event) {
	if !s.tracked(ev) {
		ix.filtered++
		return
	}
	for _, h := range ev.BlockHashes {
		j, ok := s.byEngine.find(h)
		if !ok {
			ix.unknownRemoves++
			continue
		}
		i := int32(s.byEngine.slots[j].val - 1)
		e := &ix.slab[i]
		if e.refs > 1 {
			e.refs--
			continue
		}
		s.byEngine.deleteAt(j)
		s.byKey.dec(e.key)
		ix.unlink(i)
		ix.freeSlot(i)
	}
}

func (ix *Index) evictLocked() {
	i := ix.tail
	if i == nilIdx {
		return
	}
	ix.deleteLocked(ix.srcs[ix.slab[i].src], i)
	ix.evictions++
}

func (ix *Index) deleteLocked(s *source, i int32) {
	e := &ix.slab[i]
	s.byEngine.del(e.engine)
	s.byKey.dec(e.key)
	ix.unlink(i)
	ix.freeSlot(i)
}

func (ix *Index) freeSlot(i int32) {
	ix.unlinkFirst(i)
	ix.slab[i] = entry{prev: nilIdx, next: ix.free}
	ix.free = i
	ix.n--
}

func (ix *Index) unlink(i int32) {
	e := &ix.slab[i]
	if e.prev != nilIdx {
		ix.slab[e.prev].next = e.next
	} else {
		ix.head = e.next
	}
	if e.next != nilIdx {
		ix.slab[e.next].prev = e.prev
	} else {
		ix.tail = e.prev
	}
	e.prev, e.next = nilIdx, nilIdx
}

func (ix *Index) pushFront(i int32) {
	e := &ix.slab[i]
	e.prev, e.next = nilIdx, ix.head
	if ix.head != nilIdx {
		ix.slab[ix.head].prev = i
	}
	ix.head = i
	if ix.tail == nilIdx {
		ix.tail = i
	}
}

// clearLocked drops all of s's entries.
func (ix *Index) clearLocked(s *source) {
	s.byEngine.each(func(v uint32) {
		ix.unlink(int32(v - 1))
		ix.freeSlot(int32(v - 1))
	})
	// Fresh tables: a restarted replica starts empty, and they never shrink.
	s.byEngine = newTable(rand.Uint64())
	s.byKey = newTable(rand.Uint64())
}

// ClearSource forgets everything src holds (e.g. the replica restarted)
// and clears its stale mark; the source stays registered.
func (ix *Index) ClearSource(src string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if s := ix.lookupLocked(src); s != nil {
		ix.clearLocked(s)
		// A restarted replica may come back with another layout.
		s.stale, s.group = false, -1
	}
}

// RemoveSource forgets src entirely; its id becomes invalid.
func (ix *Index) RemoveSource(src string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.lookupLocked(src)
	if s == nil {
		return
	}
	ix.clearLocked(s)
	ix.srcs[s.id] = nil
	delete(ix.byName, src)
}

// MarkStale records that src's events were lost, so its entries may be
// wrong (missed removals read as hits) until it is cleared.
func (ix *Index) MarkStale(src string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.sourceLocked(src).stale = true
}

// Stale reports whether src's view may be incomplete.
func (ix *Index) Stale(src string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := ix.lookupLocked(src)
	return s != nil && s.stale
}

// Match sets out[j] to the number of leading keys source srcs[j] holds,
// i.e. its longest cached prefix in blocks (0 for unknown sources).
// out must be at least len(srcs) long.
func (ix *Index) Match(keys []uint64, srcs []string, out []int) {
	out = out[:len(srcs)]
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for j, name := range srcs {
		out[j] = matchSource(ix.lookupLocked(name), keys)
	}
}

// MatchIDs is Match with ids from SourceID, skipping the name lookup.
func (ix *Index) MatchIDs(keys []uint64, ids []int, out []int) {
	out = out[:len(ids)]
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for j, id := range ids {
		var s *source
		if id >= 0 && id < len(ix.srcs) {
			s = ix.srcs[id]
		}
		out[j] = matchSource(s, keys)
	}
}

func matchSource(s *source, keys []uint64) int {
	if s == nil {
		return 0
	}
	for i, k := range keys {
		if !s.byKey.has(k) {
			return i
		}
	}
	return len(keys)
}

// IndexStats is a snapshot for /metrics.
type IndexStats struct {
	Entries   int
	Capacity  int
	Sources   int
	Stale     int
	BlockSize int
	// Evictions counts entries dropped to respect the capacity.
	Evictions uint64
	// Orphans counts stored events whose parent block was unknown.
	Orphans uint64
	// Misaligned counts stored events whose tokens did not pair with
	// their hashes or whose block size differed from the pool's.
	Misaligned uint64
	// Filtered counts events or blocks left out by design (other media or
	// groups, LoRA, extra keys).
	Filtered uint64
	// UnknownRemoves counts removed hashes the index did not hold.
	UnknownRemoves uint64
	// ApproxBytes is the index's memory: slab plus table slots.
	ApproxBytes int64
}

// Stats returns counters and sizes.
func (ix *Index) Stats() IndexStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := IndexStats{
		Entries:        ix.n,
		Capacity:       ix.max,
		BlockSize:      ix.blockSize,
		Evictions:      ix.evictions,
		Orphans:        ix.orphans,
		Misaligned:     ix.misaligned,
		Filtered:       ix.filtered,
		UnknownRemoves: ix.unknownRemoves,
	}
	st.ApproxBytes = int64(cap(ix.slab))*int64(unsafe.Sizeof(entry{})) + ix.firsts.bytes()
	for _, s := range ix.srcs {
		if s != nil {
			st.Sources++
			if s.stale {
				st.Stale++
			}
			st.ApproxBytes += s.byEngine.bytes() + s.byKey.bytes()
		}
	}
	return st
}

// SourceStat describes one source.
type SourceStat struct {
	Name    string
	ID      int
	Entries int
	Stale   bool
}

// Sources lists the registered sources (allocates; for metrics and debug).
func (ix *Index) Sources() []SourceStat {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]SourceStat, 0, len(ix.byName))
	for _, s := range ix.srcs {
		if s != nil {
			out = append(out, SourceStat{Name: s.name, ID: int(s.id), Entries: s.byEngine.n, Stale: s.stale})
		}
	}
	return out
}
