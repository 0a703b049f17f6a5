package kv

import (
	"math/rand/v2"
	"testing"
)

// TestTableMatchesMap runs random puts, counts and deletes against a Go
// map, on random keys and on sequential ones (engine hashes like
// id<<40|n), through growth and back-shifting deletes, and checks every
// key, the size and a full iteration after each round.
func TestTableMatchesMap(t *testing.T) {
	for name, keyOf := range map[string]func(r *rand.Rand) uint64{
		"random":     func(r *rand.Rand) uint64 { return r.Uint64() >> r.IntN(64) },
		"sequential": func(r *rand.Rand) uint64 { return 7<<40 | uint64(r.IntN(3000)) },
	} {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			tb := newTable(r.Uint64())
			want := map[uint64]uint32{}
			var keys []uint64
			for round := range 40 {
				for range 500 {
					var k uint64
					if len(keys) > 0 && r.IntN(2) == 0 {
						k = keys[r.IntN(len(keys))]
					} else {
						k = keyOf(r)
						keys = append(keys, k)
					}
					switch op := r.IntN(10); {
					case op < 3:
						v := uint32(r.IntN(1000) + 1)
						tb.put(k, v)
						want[k] = v
					case op < 6:
						tb.inc(k)
						want[k]++
					case op < 8:
						tb.dec(k)
						if want[k] > 1 {
							want[k]--
						} else {
							delete(want, k)
						}
					default:
						tb.del(k)
						delete(want, k)
					}
				}
				if tb.n != len(want) {
					t.Fatalf("round %d: table holds %d, map %d", round, tb.n, len(want))
				}
				for _, k := range keys {
					got, ok := tb.get(k)
					w, wok := want[k]
					if ok != wok || got != w || tb.has(k) != wok {
						t.Fatalf("round %d: key %#x: table %d/%v, map %d/%v", round, k, got, ok, w, wok)
					}
				}
				var sum, wsum uint64
				tb.each(func(v uint32) { sum += uint64(v) })
				for _, v := range want {
					wsum += uint64(v)
				}
				if sum != wsum {
					t.Fatalf("round %d: each sums %d, map %d", round, sum, wsum)
				}
			}
			if tb.bytes() != int64(len(tb.slots))*slotBytes || tb.n*4 > len(tb.slots)*3 {
				t.Fatalf("%d entries in %d slots", tb.n, len(tb.slots))
			}
		})
	}
}

// TestTableZeroValue: the zero table answers lookups and deletes.
func TestTableZeroValue(t *testing.T) {
	var tb table
	if _, ok := tb.get(1); ok || tb.has(0) {
		t.Fatal("empty table found a key")
	}
	tb.del(1)
	tb.dec(1)
	tb.inc(0)
	if v, ok := tb.get(0); !ok || v != 1 || tb.n != 1 {
		t.Fatalf("key 0: %d %v, n %d", v, ok, tb.n)
	}
}
