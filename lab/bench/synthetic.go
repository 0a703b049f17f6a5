package bench

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// SyntheticTrace makes a small Mooncake-shaped trace for smoke runs when the
// shared traces are absent: a few root documents of several chunks, each
// followed by turns that extend a root with fresh chunks, Poisson arrivals.
// It exercises the same code paths, not the same statistics.
func SyntheticTrace(n int, seed uint64) []Request {
	rnd := rand.New(rand.NewPCG(seed, 0x5eed))
	const roots = 8
	var next uint64 = 1 << 32 // clear of small ids, like a separate trace
	rootIDs := make([][]uint64, roots)
	for i := range rootIDs {
		k := 2 + rnd.IntN(6)
		for range k {
			rootIDs[i] = append(rootIDs[i], next)
			next++
		}
	}
	out := make([]Request, 0, n)
	var t time.Duration
	for i := range n {
		ri := rnd.IntN(roots)
		root := rootIDs[ri]
		ids := append([]uint64(nil), root...)
		for range 1 + rnd.IntN(3) {
			ids = append(ids, next)
			next++
		}
		in := (len(ids)-1)*BlockTokens + 1 + rnd.IntN(BlockTokens)
		t += time.Duration(rnd.ExpFloat64() * float64(50*time.Millisecond))
		out = append(out, Request{
			Index: i, Arrival: t, InputTokens: in, OutputTokens: 1 + rnd.IntN(64), HashIDs: ids,
			Session: "root-" + strconv.Itoa(ri),
		})
	}
	return out
}
