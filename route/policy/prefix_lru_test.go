package policy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/turnout/turnout/route/fleet"
)

// insertEach is insert as first written: every block touched, last first.
func (l *blockLRU) insertEach(blocks []uint64) {
	for i := len(blocks) - 1; i >= 0; i-- {
		l.touch(blocks[i])
	}
}

// state is everything observable of an LRU (and its slots): the order,
// each key's slot, the links both ways.
func (l *blockLRU) state() string {
	var keys []uint64
	for i := l.head; i >= 0; i = l.nodes[i].next {
		keys = append(keys, l.nodes[i].key)
	}
	var back []uint64
	for i := l.tail; i >= 0; i = l.nodes[i].prev {
		back = append(back, l.nodes[i].key)
	}
	slices.Reverse(back)
	return fmt.Sprintf("order %v back %v slots %v nodes %d free %d", keys, back, l.m, len(l.nodes), l.free)
}

// insert takes a shortcut when the list already starts with the prompt's
// prefix (extendHead); on any sequence of prompts -- extended, shortened,
// repeated blocks, evictions, other prefixes -- it must leave the LRU as
// touching every block does.
func TestBlockLRUInsertMatchesTouch(t *testing.T) {
	rnd := rand.New(rand.NewPCG(11, 12))
	for run := 0; run < 300; run++ {
		capacity := 16 + rnd.IntN(24)
		fast, slow := newBlockLRU(capacity), newBlockLRU(capacity)
		var prev []uint64
		shortcuts := 0
		for step := 0; step < 40; step++ {
			var blocks []uint64
			switch rnd.IntN(5) {
			case 0: // the last prompt and a few more blocks (a next turn)
				blocks = append(slices.Clone(prev), randBlocks(rnd, rnd.IntN(maxExtend+3))...)
			case 1: // the last prompt with its tail changed
				blocks = append(slices.Clone(prev[:rnd.IntN(len(prev)+1)]), randBlocks(rnd, rnd.IntN(4))...)
			case 2: // a repeat inside the prompt
				blocks = append(slices.Clone(prev), randBlocks(rnd, 2)...)
				if len(blocks) > 0 {
					blocks = append(blocks, blocks[rnd.IntN(len(blocks))])
				}
			case 3: // blocks cached elsewhere in the list
				blocks = append(slices.Clone(prev), slow.someKeys(rnd, 3)...)
			default: // another prompt
				blocks = randBlocks(rnd, 1+rnd.IntN(capacity+4))
			}
			if fast.headMatches(blocks) {
				shortcuts++
			}
			fast.insert(blocks)
			slow.insertEach(blocks)
			if got, want := fast.state(), slow.state(); got != want {
				t.Fatalf("run %d step %d, insert %v:\n got %s\nwant %s", run, step, blocks, got, want)
			}
			prev = blocks
		}
		if shortcuts == 0 {
			t.Fatalf("run %d never started at the head: the shortcut went untested", run)
		}
	}
}

// headMatches reports whether the list starts with blocks[0].
func (l *blockLRU) headMatches(blocks []uint64) bool {
	return len(blocks) > 0 && l.head >= 0 && l.nodes[l.head].key == blocks[0]
}

func (l *blockLRU) someKeys(rnd *rand.Rand, n int) []uint64 {
	var out []uint64
	for range n {
		if len(l.nodes) > 0 {
			out = append(out, l.nodes[rnd.IntN(len(l.nodes))].key)
		}
	}
	return out
}

// randBlocks draws from a small key space, so prompts share blocks.
func randBlocks(rnd *rand.Rand, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(rnd.IntN(60))
	}
	return out
}

// chainedPrompt is a prompt of n blocks hashed as the engine's blocks are
// (each hash names its whole prefix), drawn from few choices per position so
// that prompts share prefixes.
func chainedPrompt(rnd *rand.Rand, n int) []uint64 {
	out := make([]uint64, n)
	var prev uint64
	for i := range out {
		prev = fleet.Mix64(uint64(1+rnd.IntN(3)) ^ (prev * 0x9e3779b97f4a7c15))
		out[i] = prev
	}
	return out
}

// matchAtLeast answers as matchLen wherever that reaches the floor and 0
// below it, on LRUs filled with chained prompts and evicting (so cached
// prefixes are cut at every length).
func TestBlockLRUMatchAtLeast(t *testing.T) {
	rnd := rand.New(rand.NewPCG(21, 22))
	checked := 0
	for run := 0; run < 200; run++ {
		l := newBlockLRU(16 + rnd.IntN(48))
		for step := 0; step < 60; step++ {
			l.insert(chainedPrompt(rnd, 1+rnd.IntN(24)))
			q := chainedPrompt(rnd, 1+rnd.IntN(24))
			want := l.matchLen(q)
			for floor := 0; floor <= len(q)+1; floor++ {
				got := l.matchAtLeast(q, floor)
				if want >= floor && got != want || want < floor && got != 0 {
					t.Fatalf("run %d step %d: matchAtLeast(floor %d) = %d, matchLen %d", run, step, floor, got, want)
				}
				if want >= floor && floor > 1 {
					checked++
				}
			}
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d reached floors checked: the prompts share too little", checked)
	}
}
