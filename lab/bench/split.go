package bench

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/turnout/turnout/route/fleet"
)

// How a replay through several fronts (--fronts) hands requests to them
// (--split): the same in the e2e replay and the sim, so they can be
// compared request for request.
const (
	// SplitRequest: request i (its position in the replay) through front
	// i mod N, whatever conversation it belongs to.
	SplitRequest = "request"
	// SplitTurn: the k-th turn of a conversation through front (k + c) mod
	// N, c drawn per conversation from the seed, so consecutive turns
	// always alternate fronts (a splitting proxy that balances requests
	// without stickiness) while first turns spread over every front.
	SplitTurn = "turn"
)

// ParseSplit checks --split ("" is SplitRequest).
func ParseSplit(s string) (string, error) {
	switch s {
	case "", SplitRequest:
		return SplitRequest, nil
	case SplitTurn:
		return SplitTurn, nil
	}
	return "", fmt.Errorf("split %q: want %s or %s", s, SplitRequest, SplitTurn)
}

// FrontOf returns the front of each request for n fronts, indexed by
// Request.Index: request order under SplitRequest, turns under SplitTurn.
// A conversation is the session key, else the first hash id; a request
// with neither is a conversation of its own.
func FrontOf(reqs []Request, n int, split string, seed uint64) []int {
	size := 0
	for i := range reqs {
		size = max(size, reqs[i].Index+1)
	}
	out := make([]int, size)
	if n <= 1 {
		return out
	}
	type conv struct{ start, turns int }
	convs := map[string]*conv{}
	for i := range reqs {
		r := &reqs[i]
		if split != SplitTurn {
			out[r.Index] = i % n
			continue
		}
		key := r.Session
		if key == "" && len(r.HashIDs) > 0 {
			key = "h" + strconv.FormatUint(r.HashIDs[0], 10)
		}
		if key == "" {
			key = "i" + strconv.Itoa(r.Index)
		}
		c := convs[key]
		if c == nil {
			// The start depends on the key and the seed only, so the
			// sim and the e2e replay agree.
			c = &conv{start: int(fleet.Mix64(seed^fleet.Mix64(keyHash(key))) % uint64(n))}
			convs[key] = c
		}
		out[r.Index] = (c.start + c.turns) % n
		c.turns++
	}
	return out
}

// keyHash is FNV-1a 64 of s: stable across processes.
func keyHash(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// JitterArrivals delays each request's arrival by a draw in [0, jitter)
// from the seed (trace time, before --compress) and keeps the replay in
// arrival order: each seed replays a different interleaving of the same
// conversations, in the e2e replay as in the sim. jitter 0 returns reqs
// unchanged.
func JitterArrivals(reqs []Request, jitter time.Duration, seed uint64) []Request {
	if jitter <= 0 || len(reqs) == 0 {
		return reqs
	}
	out := slices.Clone(reqs)
	rnd := fleet.NewRand(seed)
	for i := range out {
		out[i].Arrival += time.Duration(rnd.Uint64() % uint64(jitter))
	}
	slices.SortStableFunc(out, func(a, b Request) int {
		return cmp.Compare(a.Arrival, b.Arrival)
	})
	// The first request stays the replay's origin.
	first := out[0].Arrival
	for i := range out {
		out[i].Arrival -= first
	}
	return out
}
