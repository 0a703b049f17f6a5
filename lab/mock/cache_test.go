package mock

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"sync"
	"testing"
)

// fakeSink records KV events in order.
type fakeSink struct {
	mu     sync.Mutex
	events []sinkEvent
}

type sinkEvent struct {
	kind      string // stored|removed|cleared
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []int32
	blockSize int
}

func (f *fakeSink) BlocksStored(h []uint64, parent uint64, hasParent bool, utoks []uint32, bs int) {
	toks := make([]int32, len(utoks))
	for i, t := range utoks {
		toks[i] = int32(t)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, sinkEvent{kind: "stored", hashes: h, parent: parent, hasParent: hasParent, tokens: toks, blockSize: bs})
}

func (f *fakeSink) BlocksRemoved(h []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, sinkEvent{kind: "removed", hashes: h})
}

func (f *fakeSink) AllBlocksCleared() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, sinkEvent{kind: "cleared"})
}

func (f *fakeSink) take() []sinkEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := f.events
	f.events = nil
	return ev
}

// seq returns n distinct tokens starting at base.
func seq(base, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(base + i)
	}
	return out
}

func cat(parts ...[]int32) []int32 { return slices.Concat(parts...) }

func TestHashBlockReference(t *testing.T) {
	ref := func(parent uint64, toks []int32) uint64 {
		h := fnv.New64a()
		_ = binary.Write(h, binary.LittleEndian, parent)
		for _, tk := range toks {
			_ = binary.Write(h, binary.LittleEndian, uint32(tk))
		}
		return h.Sum64()
	}
	toks := seq(100, 4)
	if got, want := HashBlock(0, toks), ref(0, toks); got != want {
		t.Fatalf("HashBlock(0) = %x, want %x", got, want)
	}
	if got, want := HashBlock(42, toks), ref(42, toks); got != want {
		t.Fatalf("HashBlock(42) = %x, want %x", got, want)
	}
	hs := BlockHashes(seq(0, 9), 4) // 2 full blocks, partial tail ignored
	if len(hs) != 2 || hs[0] != HashBlock(0, seq(0, 4)) || hs[1] != HashBlock(hs[0], seq(4, 4)) {
		t.Fatalf("BlockHashes chain wrong: %x", hs)
	}
	// Same block content under another parent is another block.
	if HashBlock(hs[0], seq(0, 4)) == hs[0] {
		t.Fatal("parent not part of the hash")
	}
}

func TestCacheHitCounting(t *testing.T) {
	const bs = 4
	a, b, c := seq(0, bs), seq(100, bs), seq(200, bs)
	tests := []struct {
		name  string
		warm  [][]int32 // served first
		query []int32
		want  int
	}{
		{name: "cold", query: cat(a, b), want: 0},
		{name: "exact repeat", warm: [][]int32{cat(a, b)}, query: cat(a, b), want: 2 * bs},
		{name: "shared prefix then diverge", warm: [][]int32{cat(a, b)}, query: cat(a, c), want: bs},
		{name: "partial tail never counts", warm: [][]int32{cat(a, b, seq(300, 3))}, query: cat(a, b, seq(300, 3)), want: 2 * bs},
		{name: "longer than cached", warm: [][]int32{a}, query: cat(a, b, c), want: bs},
		{name: "same block other parent misses", warm: [][]int32{cat(a, b)}, query: cat(c, b), want: 0},
		{name: "leading run only", warm: [][]int32{cat(a, b, c), cat(c)}, query: cat(a, c), want: bs},
		{name: "shorter than a block", warm: [][]int32{seq(0, 3)}, query: seq(0, 3), want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cache := NewCache(bs, 64)
			for _, w := range tc.warm {
				cache.Serve(w)
			}
			if got := cache.Lookup(tc.query); got != tc.want {
				t.Fatalf("Lookup = %d, want %d", got, tc.want)
			}
			if got := cache.Serve(tc.query); got != tc.want {
				t.Fatalf("Serve = %d, want %d", got, tc.want)
			}
			// After serving, the whole prompt's full blocks are cached.
			if got, want := cache.Lookup(tc.query), len(tc.query)/bs*bs; got != want {
				t.Fatalf("Lookup after Serve = %d, want %d", got, want)
			}
		})
	}
}

func TestCacheLRUEvictionOrder(t *testing.T) {
	const bs = 2
	cache := NewCache(bs, 4)
	p := seq(0, 3*bs) // blocks p0 p1 p2
	ph := BlockHashes(p, bs)
	cache.Serve(p)
	// Touching in reverse leaves the first block most recent.
	if got := cache.Blocks(); !slices.Equal(got, ph) {
		t.Fatalf("MRU order = %x, want %x", got, ph)
	}
	if cache.Lookup(p[:2]) != bs || cache.Len() != 3 {
		t.Fatal("unexpected state")
	}
	q := seq(100, bs)
	cache.Serve(q) // fills the 4th slot, no eviction
	r := seq(200, bs)
	cache.Serve(r) // evicts p2: the deepest suffix goes first, the prefix survives
	if cache.Contains(ph[2]) {
		t.Fatal("p2 should have been evicted first")
	}
	if !cache.Contains(ph[0]) || !cache.Contains(ph[1]) {
		t.Fatal("prefix blocks evicted before the suffix")
	}
	if got := cache.Lookup(p); got != 2*bs {
		t.Fatalf("Lookup(p) = %d, want %d", got, 2*bs)
	}
	// Touching p's prefix makes q the LRU.
	cache.Serve(p[:2*bs])
	cache.Serve(seq(300, bs))
	if cache.Contains(BlockHashes(q, bs)[0]) {
		t.Fatal("q should be evicted after p was touched")
	}
	if cache.Len() != 4 {
		t.Fatalf("Len = %d, want 4", cache.Len())
	}
}

func TestCacheNeverEvictsOwnBlocks(t *testing.T) {
	const bs = 2
	cache := NewCache(bs, 3)
	long := seq(0, 5*bs) // 5 blocks, capacity 3: only the first 3 are kept
	if got := cache.Serve(long); got != 0 {
		t.Fatalf("first Serve = %d", got)
	}
	if got := cache.Serve(long); got != 3*bs {
		t.Fatalf("second Serve = %d, want %d", got, 3*bs)
	}
	// A prompt reusing 2 cached blocks plus 1 new one must evict the
	// unrelated third block, not its own prefix.
	hs := BlockHashes(long, bs)
	mixed := cat(long[:2*bs], seq(500, bs))
	if got := cache.Serve(mixed); got != 2*bs {
		t.Fatalf("mixed Serve = %d", got)
	}
	if !cache.Contains(hs[0]) || !cache.Contains(hs[1]) || cache.Contains(hs[2]) {
		t.Fatal("wrong block evicted")
	}
}

func TestCacheSinkEvents(t *testing.T) {
	const bs = 2
	sink := &fakeSink{}
	cache := NewCache(bs, 4)
	cache.SetSink(sink)

	p := seq(0, 3*bs+1) // 3 full blocks + partial
	ph := BlockHashes(p, bs)
	cache.Serve(p)
	ev := sink.take()
	if len(ev) != 1 || ev[0].kind != "stored" {
		t.Fatalf("events = %+v", ev)
	}
	if !slices.Equal(ev[0].hashes, ph) || ev[0].hasParent || ev[0].parent != 0 ||
		!slices.Equal(ev[0].tokens, p[:3*bs]) || ev[0].blockSize != bs {
		t.Fatalf("stored event = %+v", ev[0])
	}

	// Repeat: nothing new stored.
	cache.Serve(p)
	if ev := sink.take(); len(ev) != 0 {
		t.Fatalf("repeat produced events %+v", ev)
	}

	// Extending the prompt stores only the new block, chained on p2.
	ext := cat(p[:3*bs], seq(50, bs))
	cache.Serve(ext)
	ev = sink.take()
	if len(ev) != 1 || ev[0].kind != "stored" || !ev[0].hasParent || ev[0].parent != ph[2] ||
		!slices.Equal(ev[0].tokens, seq(50, bs)) || len(ev[0].hashes) != 1 {
		t.Fatalf("extension events = %+v", ev)
	}

	// Two new blocks in a full cache: one removal batch, then the store.
	o := seq(900, 2*bs)
	cache.Serve(o)
	ev = sink.take()
	if len(ev) != 2 || ev[0].kind != "removed" || ev[1].kind != "stored" {
		t.Fatalf("eviction events = %+v", ev)
	}
	eh := BlockHashes(ext, bs)
	if want := []uint64{eh[3], eh[2]}; !slices.Equal(ev[0].hashes, want) {
		t.Fatalf("removed %x, want LRU-first %x", ev[0].hashes, want)
	}

	cache.Reset()
	ev = sink.take()
	if len(ev) != 1 || ev[0].kind != "cleared" || cache.Len() != 0 || cache.Lookup(o) != 0 {
		t.Fatalf("reset events = %+v len=%d", ev, cache.Len())
	}
	// Usable after reset.
	cache.Serve(o)
	if cache.Lookup(o) != 2*bs {
		t.Fatal("cache unusable after Reset")
	}
}

func TestCacheConcurrentServe(t *testing.T) {
	cache := NewCache(4, 32)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				cache.Serve(seq((g*7+i)%50, 4*((i%5)+1)))
			}
		}()
	}
	wg.Wait()
	if n := cache.Len(); n > 32 || n != len(cache.Blocks()) {
		t.Fatalf("Len %d, list %d", n, len(cache.Blocks()))
	}
}
