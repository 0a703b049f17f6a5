package kv

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func seqTokens(n int, base uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

func TestBlockKeys(t *testing.T) {
	toks := seqTokens(10, 100) // 2 full blocks of 4, 2 tokens left over
	keys := BlockKeys(toks, 4, nil)
	if len(keys) != 2 {
		t.Fatalf("got %d keys, want 2 (full blocks only)", len(keys))
	}
	le := func(ts []uint32) []byte {
		b := make([]byte, 4*len(ts))
		for i, v := range ts {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
		return b
	}
	if want := xxhash.Sum64(le(toks[:4])); keys[0] != want {
		t.Fatalf("key0 = %x, want xxhash(seed 0) %x", keys[0], want)
	}
	d := xxhash.NewWithSeed(keys[0])
	_, _ = d.Write(le(toks[4:8]))
	if want := d.Sum64(); keys[1] != want {
		t.Fatalf("key1 = %x, want xxhash(seed key0) %x", keys[1], want)
	}

	// Chaining: the same second block after a different first block differs.
	other := append(seqTokens(4, 0), toks[4:8]...)
	if k := BlockKeys(other, 4, nil); k[1] == keys[1] {
		t.Fatal("second key ignores the first block")
	}
	// Blocks longer than the internal buffer hash the same as one write.
	long := seqTokens(300, 7)
	if got, want := BlockKeys(long, 300, nil)[0], xxhash.Sum64(le(long)); got != want {
		t.Fatalf("long block key %x, want %x", got, want)
	}
	for _, bs := range []int{0, -1, 11} {
		if k := BlockKeys(toks, bs, nil); len(k) != 0 {
			t.Fatalf("blockSize %d: got %d keys, want 0", bs, len(k))
		}
	}
}

func TestBlockKeysAllocs(t *testing.T) {
	toks := seqTokens(4096, 1)
	dst := make([]uint64, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = BlockKeys(toks, 16, dst) }); n != 0 {
		t.Fatalf("BlockKeys allocates %.1f times per run", n)
	}
}

func stored(hashes []uint64, parent uint64, hasParent bool, toks []uint32, bs int) Event {
	return Event{Kind: EventBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: hasParent, TokenIDs: toks, BlockSize: bs, Medium: MediumGPU}
}

func removed(hashes ...uint64) Event {
	return Event{Kind: EventBlockRemoved, BlockHashes: hashes, Medium: MediumGPU}
}

func batch(evs ...Event) Batch { return Batch{Events: evs} }

func match(ix *Index, keys []uint64, srcs ...string) []int {
	out := make([]int, len(srcs))
	ix.Match(keys, srcs, out)
	return out
}

func TestIndexApply(t *testing.T) {
	const bs = 4
	prompt := seqTokens(5*bs, 1)
	keys := BlockKeys(prompt, bs, nil)

	type step struct {
		src string
		b   Batch
	}
	tests := []struct {
		name  string
		steps []step
		want  []int // Match(keys) for sources a, b
		check func(t *testing.T, ix *Index)
	}{
		{
			name:  "store one event of three blocks",
			steps: []step{{"a", batch(stored([]uint64{1, 2, 3}, 0, false, prompt[:3*bs], bs))}},
			want:  []int{3, 0},
		},
		{
			name: "parent chaining across two events",
			steps: []step{
				{"a", batch(stored([]uint64{1, 2}, 0, false, prompt[:2*bs], bs))},
				{"a", batch(stored([]uint64{3, 4}, 2, true, prompt[2*bs:4*bs], bs))},
			},
			want: []int{4, 0},
		},
		{
			name: "unknown parent is an orphan",
			steps: []step{
				{"a", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs))},
				{"a", batch(stored([]uint64{3}, 99, true, prompt[2*bs:3*bs], bs))},
			},
			want: []int{1, 0},
			check: func(t *testing.T, ix *Index) {
				if st := ix.Stats(); st.Orphans != 1 || st.Entries != 1 {
					t.Fatalf("stats %+v, want 1 orphan and 1 entry", st)
				}
			},
		},
		{
			name: "remove by engine hash counts leading blocks only",
			steps: []step{
				{"a", batch(stored([]uint64{1, 2, 3}, 0, false, prompt[:3*bs], bs))},
				{"a", batch(removed(2, 77))},
			},
			want: []int{1, 0},
			check: func(t *testing.T, ix *Index) {
				if st := ix.Stats(); st.Entries != 2 || st.UnknownRemoves != 1 {
					t.Fatalf("stats %+v, want 2 entries, 1 unknown remove", st)
				}
			},
		},
		{
			name: "duplicate stores need as many removes",
			steps: []step{
				{"a", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs), stored([]uint64{1}, 0, false, prompt[:bs], bs))},
				{"a", batch(removed(1))},
			},
			want: []int{1, 0},
		},
		{
			name: "AllBlocksCleared empties only its source",
			steps: []step{
				{"a", batch(stored([]uint64{1, 2}, 0, false, prompt[:2*bs], bs))},
				{"b", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs))},
				{"a", batch(Event{Kind: EventAllBlocksCleared})},
			},
			want: []int{0, 1},
		},
		{
			name: "sources with different engine hashes share our keys",
			steps: []step{
				{"a", batch(stored([]uint64{1, 2}, 0, false, prompt[:2*bs], bs))},
				{"b", batch(stored([]uint64{1001, 1002, 1003}, 0, false, prompt[:3*bs], bs))},
			},
			want: []int{2, 3},
		},
		{
			name: "other media, groups, LoRA are not indexed",
			steps: []step{{"a", batch(
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1}, TokenIDs: prompt[:bs], BlockSize: bs, Medium: "CPU"},
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1}, TokenIDs: prompt[:bs], BlockSize: bs, HasGroup: true, GroupIdx: 1},
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1}, TokenIDs: prompt[:bs], BlockSize: bs, HasLoraID: true, LoraID: 1},
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1}, TokenIDs: prompt[:bs], BlockSize: bs, LoraName: "x"},
			)}},
			want: []int{0, 0},
		},
		{
			name: "hybrid model: the full-attention group is indexed, not group 0",
			steps: []step{{"a", batch(
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: prompt[:2*bs], BlockSize: bs, HasGroup: true, GroupIdx: 0, SpecKind: "sliding_window"},
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: prompt[:3*bs], BlockSize: bs, HasGroup: true, GroupIdx: 1, SpecKind: "full_attention"},
				Event{Kind: EventBlockRemoved, BlockHashes: []uint64{1}, HasGroup: true, GroupIdx: 0}, // sliding window slid
				Event{Kind: EventBlockStored, BlockHashes: []uint64{9}, TokenIDs: seqTokens(8*bs, 0), BlockSize: 8 * bs, HasGroup: true, GroupIdx: 2, SpecKind: "mamba"},
			)}},
			want: []int{3, 0},
			check: func(t *testing.T, ix *Index) {
				if st := ix.Stats(); st.BlockSize != bs || st.Filtered != 3 {
					t.Fatalf("stats %+v, want block size %d and 3 filtered", st, bs)
				}
			},
		},
		{
			name: "group_idx without kind: group 0",
			steps: []step{{"a", batch(
				Event{Kind: EventBlockStored, BlockHashes: []uint64{7}, TokenIDs: prompt[:bs], BlockSize: bs, HasGroup: true, GroupIdx: 1},
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: prompt[:2*bs], BlockSize: bs, HasGroup: true, GroupIdx: 0},
				Event{Kind: EventBlockRemoved, BlockHashes: []uint64{1}, HasGroup: true, GroupIdx: 1},
			)}},
			want: []int{2, 0},
		},
		{
			name: "a CPU-tier removal leaves the GPU copy",
			steps: []step{
				{"a", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs))},
				{"a", batch(Event{Kind: EventBlockRemoved, BlockHashes: []uint64{1}, Medium: "CPU"})},
			},
			want: []int{1, 0},
		},
		{
			name: "medium absent (old vLLM) and group 0 are indexed",
			steps: []step{{"a", batch(
				Event{Kind: EventBlockStored, BlockHashes: []uint64{1}, TokenIDs: prompt[:bs], BlockSize: bs},
				Event{Kind: EventBlockStored, BlockHashes: []uint64{2}, ParentHash: 1, HasParent: true, TokenIDs: prompt[bs : 2*bs], BlockSize: bs, HasGroup: true},
			)}},
			want: []int{2, 0},
		},
		{
			name: "extra keys stop the chain, children become orphans",
			steps: []step{
				{"a", batch(Event{Kind: EventBlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: prompt[:3*bs], BlockSize: bs, ExtraKeys: []bool{false, true, false}})},
				{"a", batch(stored([]uint64{4}, 2, true, prompt[3*bs:4*bs], bs))},
			},
			want: []int{1, 0},
		},
		{
			name: "misaligned tokens and foreign block size are skipped",
			steps: []step{
				{"a", batch(stored([]uint64{1, 2}, 0, false, prompt[:2*bs-1], bs))},
				{"a", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs))},
				{"a", batch(stored([]uint64{5}, 0, false, prompt[:2*bs], 2*bs))},
			},
			want: []int{1, 0},
			check: func(t *testing.T, ix *Index) {
				if st := ix.Stats(); st.Misaligned != 2 || st.BlockSize != bs {
					t.Fatalf("stats %+v, want 2 misaligned, block size %d", st, bs)
				}
			},
		},
		{
			name: "engine hash reused for other tokens rebinds",
			steps: []step{
				{"a", batch(stored([]uint64{1}, 0, false, seqTokens(bs, 500), bs))},
				{"a", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs))},
			},
			want: []int{1, 0},
			check: func(t *testing.T, ix *Index) {
				if got := match(ix, BlockKeys(seqTokens(bs, 500), bs, nil), "a")[0]; got != 0 {
					t.Fatalf("old tokens still match %d blocks", got)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(1000)
			for _, s := range tc.steps {
				ix.Apply(s.src, s.b)
			}
			got := match(ix, keys, "a", "b")
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("Match = %v, want %v", got, tc.want)
			}
			if tc.check != nil {
				tc.check(t, ix)
			}
		})
	}
}

func TestIndexSources(t *testing.T) {
	const bs = 2
	prompt := seqTokens(3*bs, 1)
	keys := BlockKeys(prompt, bs, nil)
	ix := NewIndex(100)
	ix.Apply("a", batch(stored([]uint64{1, 2, 3}, 0, false, prompt, bs)))
	ix.Apply("b", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs)))
	if ix.BlockSize() != bs {
		t.Fatalf("BlockSize = %d, want %d", ix.BlockSize(), bs)
	}

	ids := []int{ix.SourceID("a"), ix.SourceID("b"), ix.SourceID("c"), -1, 1 << 20}
	out := make([]int, len(ids))
	ix.MatchIDs(keys, ids, out)
	if fmt.Sprint(out) != "[3 1 0 0 0]" {
		t.Fatalf("MatchIDs = %v", out)
	}
	if got := match(ix, keys[:2], "a", "nope"); fmt.Sprint(got) != "[2 0]" {
		t.Fatalf("Match of a 2-key prefix = %v", got)
	}

	// Stale marking, cleared by ClearSource.
	ix.MarkStale("a")
	if !ix.Stale("a") || ix.Stale("b") || ix.Stale("zzz") {
		t.Fatal("stale flags wrong after MarkStale(a)")
	}
	if st := ix.Stats(); st.Stale != 1 {
		t.Fatalf("Stats.Stale = %d", st.Stale)
	}
	ix.ClearSource("a")
	if ix.Stale("a") || match(ix, keys, "a")[0] != 0 {
		t.Fatal("ClearSource left a stale flag or entries")
	}
	// A cleared source keeps its id; a removed one loses it.
	ix.Apply("a", batch(stored([]uint64{1}, 0, false, prompt[:bs], bs)))
	ix.MatchIDs(keys, ids[:1], out)
	if out[0] != 1 {
		t.Fatalf("after ClearSource and re-store MatchIDs = %d, want 1", out[0])
	}
	ix.RemoveSource("a")
	ix.MatchIDs(keys, ids[:1], out)
	if out[0] != 0 {
		t.Fatal("removed source still matches by old id")
	}
	if newID := ix.SourceID("a"); newID == ids[0] {
		t.Fatal("id reused after RemoveSource")
	}
	if st := ix.Stats(); st.Entries != 1 || st.Sources != 3 {
		t.Fatalf("stats %+v, want 1 entry (b) and sources a, b, c", st)
	}
	var names []string
	for _, s := range ix.Sources() {
		names = append(names, fmt.Sprintf("%s:%d", s.Name, s.Entries))
	}
	if fmt.Sprint(names) != "[b:1 c:0 a:0]" {
		t.Fatalf("Sources = %v", names)
	}
	// Changing the block size invalidates every key.
	ix.SetBlockSize(bs * 2)
	if st := ix.Stats(); st.Entries != 0 || st.BlockSize != 2*bs {
		t.Fatalf("after SetBlockSize: %+v", st)
	}
}

func TestIndexEviction(t *testing.T) {
	const bs, max = 2, 10
	ix := NewIndex(max)
	prompt := seqTokens(25*bs, 1)
	keys := BlockKeys(prompt, bs, nil)
	// 25 blocks, one event each, chained; spread over two sources.
	for i := range 25 {
		src := "a"
		if i >= 20 {
			src = "b"
		}
		ev := stored([]uint64{uint64(i + 1)}, uint64(i), i > 0, prompt[i*bs:(i+1)*bs], bs)
		if src == "b" && i == 20 {
			ev = stored([]uint64{21, 22, 23, 24, 25}, 0, false, prompt[:5*bs], bs)
		}
		if src == "b" && i > 20 {
			continue
		}
		ix.Apply(src, batch(ev))
	}
	st := ix.Stats()
	if st.Entries != max || st.Evictions != 20+5-max {
		t.Fatalf("stats %+v, want %d entries and %d evictions", st, max, 25-max)
	}
	// The oldest (a's first blocks) went first; a keeps blocks 16..20 (no
	// leading prefix left), b its 5 fresh ones.
	if got := match(ix, keys, "a", "b"); fmt.Sprint(got) != "[0 5]" {
		t.Fatalf("Match = %v, want [0 5]", got)
	}
	s := ix.Sources()
	if s[0].Entries != 5 || s[1].Entries != 5 {
		t.Fatalf("per-source entries %+v", s)
	}
	// Slots are reused: the slab never grows past the bound.
	for i := range 100 {
		ix.Apply("c", batch(stored([]uint64{uint64(1000 + i)}, 0, false, prompt[:bs], bs)))
	}
	if n := len(ix.slab); n > max {
		t.Fatalf("slab grew to %d > %d", n, max)
	}
	if st := ix.Stats(); st.Entries != max || st.ApproxBytes <= 0 {
		t.Fatalf("stats after churn %+v", st)
	}
}

func TestMatchAllocs(t *testing.T) {
	const bs = 16
	ix := NewIndex(10000)
	prompt := seqTokens(64*bs, 1)
	hashes := make([]uint64, 64)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	srcs := make([]string, 8)
	for i := range srcs {
		srcs[i] = fmt.Sprintf("replica-%d", i)
		n := 8 * (i + 1)
		ix.Apply(srcs[i], batch(stored(hashes[:n], 0, false, prompt[:n*bs], bs)))
	}
	keys := BlockKeys(prompt, bs, nil)
	out := make([]int, len(srcs))
	ids := make([]int, len(srcs))
	for i, s := range srcs {
		ids[i] = ix.SourceID(s)
	}
	if n := testing.AllocsPerRun(100, func() { ix.Match(keys, srcs, out) }); n != 0 {
		t.Fatalf("Match allocates %.1f times per run", n)
	}
	if n := testing.AllocsPerRun(100, func() { ix.MatchIDs(keys, ids, out) }); n != 0 {
		t.Fatalf("MatchIDs allocates %.1f times per run", n)
	}
	if out[0] != 8 || out[7] != 64 {
		t.Fatalf("Match = %v", out)
	}
	// MatchFirst: the same, asking only the first block's holders; a
	// source at a position the caller does not map is skipped.
	at := make([]int32, len(srcs))
	for i, id := range ids {
		at[id] = int32(i)
	}
	at[ids[7]] = -1
	var m Matches
	m.Size(len(srcs))
	if n := testing.AllocsPerRun(100, func() { ix.MatchFirst(keys, at, &m); m.Reset() }); n != 0 {
		t.Fatalf("MatchFirst allocates %.1f times per run", n)
	}
	ix.MatchFirst(keys, at, &m)
	if fmt.Sprint(m.Blocks) != "[8 16 24 32 40 48 56 0]" || m.Held[0] != 0x7f {
		t.Fatalf("MatchFirst = %v, held %b", m.Blocks, m.Held[0])
	}
}

func TestIndexConcurrent(t *testing.T) {
	const bs = 4
	ix := NewIndex(64)
	prompt := seqTokens(32*bs, 1)
	keys := BlockKeys(prompt, bs, nil)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := fmt.Sprintf("r%d", w)
			for i := range 200 {
				n := 1 + i%32
				hs := make([]uint64, n)
				for j := range hs {
					hs[j] = uint64(j + 1)
				}
				ix.Apply(src, batch(stored(hs, 0, false, prompt[:n*bs], bs)))
				if i%7 == 0 {
					ix.Apply(src, batch(removed(hs[n/2:]...)))
				}
				if i%50 == 0 {
					ix.ClearSource(src)
				}
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]int, 4)
			for range 500 {
				ix.Match(keys, []string{"r0", "r1", "r2", "r3"}, out)
				for _, v := range out {
					if v < 0 || v > len(keys) {
						panic(fmt.Sprintf("match out of range: %d", v))
					}
				}
				_ = ix.Stats()
			}
		}()
	}
	wg.Wait()
	if st := ix.Stats(); st.Entries > 64 {
		t.Fatalf("entries %d exceed bound", st.Entries)
	}
}
