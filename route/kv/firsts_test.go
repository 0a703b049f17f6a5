package kv

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestMatchFirstAgreesWithMatchIDs: through random stores (fresh chains,
// continuations, re-stores of a hash with other tokens, duplicates),
// removals, evictions, clears and source removals, MatchFirst finds for
// every prompt exactly what MatchIDs finds asking every source, Held has
// exactly the positions with a match, and Reset leaves Matches zero.
func TestMatchFirstAgreesWithMatchIDs(t *testing.T) {
	const bs, nsrc, heads = 2, 12, 6
	rng := rand.New(rand.NewPCG(1, 2))
	ix := NewIndex(300) // small: evictions run throughout
	// Prompts: 6 heads of 3 blocks, each continued by 8 tails of 4 blocks.
	prompt := func(h, tail int) []uint32 {
		p := seqTokens(3*bs, uint32(h*1000))
		return append(p, seqTokens(4*bs, uint32(100000+h*1000+tail*10))...)
	}
	names := make([]string, nsrc)
	for i := range names {
		names[i] = fmt.Sprintf("r%d", i)
	}
	// engine hash of (source, head, tail, block): unique per source
	hash := func(s, h, tail, j int) uint64 { return uint64(s<<24 | h<<16 | tail<<8 | j + 1) }
	var m Matches
	ids := make([]int, nsrc)
	check := func(step int) {
		t.Helper()
		for i, n := range names {
			ids[i] = ix.SourceID(n)
		}
		at := make([]int32, 0)
		for i, id := range ids {
			for len(at) <= id {
				at = append(at, -1)
			}
			at[id] = int32(i)
		}
		want := make([]int, nsrc)
		m.Size(nsrc)
		for h := range heads {
			for tail := range 8 {
				keys := BlockKeys(prompt(h, tail), bs, nil)
				ix.MatchIDs(keys, ids, want)
				ix.MatchFirst(keys, at, &m)
				for i := range nsrc {
					held := m.Held[0]&(1<<i) != 0
					if m.Blocks[i] != want[i] || held != (want[i] > 0) || m.Stale[i] != (want[i] > 0 && ix.Stale(names[i])) {
						t.Fatalf("step %d head %d tail %d source %d: MatchFirst %d (held %v, stale %v), MatchIDs %d",
							step, h, tail, i, m.Blocks[i], held, m.Stale[i], want[i])
					}
				}
				m.Reset()
				for i := range nsrc {
					if m.Blocks[i] != 0 || m.Stale[i] || m.Held[0] != 0 {
						t.Fatalf("step %d: Reset left %d/%v at %d", step, m.Blocks[i], m.Stale[i], i)
					}
				}
			}
		}
	}
	for step := range 3000 {
		s := rng.IntN(nsrc)
		h, tail := rng.IntN(heads), rng.IntN(8)
		p := prompt(h, tail)
		switch op := rng.IntN(20); {
		case op < 8: // a fresh chain from the first block
			n := 1 + rng.IntN(7)
			hs := make([]uint64, n)
			for j := range hs {
				hs[j] = hash(s, h, tail, j)
			}
			ix.Apply(names[s], batch(stored(hs, 0, false, p[:n*bs], bs)))
		case op < 11: // a continuation after the head
			hs := []uint64{hash(s, h, tail, 3), hash(s, h, tail, 4)}
			ix.Apply(names[s], batch(stored(hs, hash(s, h, tail, 2), true, p[3*bs:5*bs], bs)))
		case op < 12: // the first block's hash re-stored with other tokens
			ix.Apply(names[s], batch(stored([]uint64{hash(s, h, tail, 0)}, 0, false, seqTokens(bs, uint32(9e6+step)), bs)))
		case op < 13: // a duplicate first block under another engine hash
			ix.Apply(names[s], batch(stored([]uint64{hash(s, h, tail, 0) | 1<<40}, 0, false, p[:bs], bs)))
		case op < 17:
			ix.Apply(names[s], batch(removed(hash(s, h, tail, rng.IntN(7)))))
		case op < 18:
			ix.MarkStale(names[s])
		case op < 19:
			ix.ClearSource(names[s])
		default:
			ix.RemoveSource(names[s])
		}
		if step%50 == 0 {
			check(step)
		}
	}
	check(3000)
	if ix.Stats().Evictions == 0 {
		t.Fatal("no evictions: the test does not cover them")
	}
	// Every first-block list is consistent: clearing every source leaves
	// no list behind.
	for _, n := range names {
		ix.RemoveSource(n)
	}
	if ix.firsts.n != 0 {
		t.Fatalf("%d first-block lists left after every source went", ix.firsts.n)
	}
}
