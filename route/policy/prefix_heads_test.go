package policy

import (
	"math/rand/v2"
	"testing"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
)

// The head index is exact: after any sequence of inserts and evictions
// (small LRUs evict often), carries and forgets, an endpoint is named a
// holder of a first block exactly when its LRU holds that block, so gating
// a keyed picker on it changes no Match.
func TestHeadIndexFollowsLRUs(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	const n = 70 // two bitset words
	p := routetest.Pool(t, n, nil)
	x := newPrefixIndex(64, 24, p)
	prompts := make([][]uint64, 40)
	for i := range prompts {
		// Distinct first blocks; later blocks shared between prompts.
		prompts[i] = append([]uint64{1000 + uint64(i)}, randBlocks(rnd, 1+rnd.IntN(12))...)
	}
	check := func(step int) {
		t.Helper()
		var dst [maxHolderWords]uint64
		for _, pr := range prompts {
			c := &Cycle{Req: &fleet.Request{Blocks: pr}}
			if !x.Holders(c, dst[:]) {
				t.Fatalf("step %d: holders not answered", step)
			}
			for i, l := range x.lrus {
				_, held := l.m[pr[0]]
				named := dst[i>>6]&(1<<(i&63)) != 0
				if held != named {
					t.Fatalf("step %d: endpoint %d holds first block %d: %v, named: %v", step, i, pr[0], held, named)
				}
			}
		}
	}
	for step := range 3000 {
		i := rnd.IntN(n)
		switch r := rnd.IntN(100); {
		case r < 2: // a reload: a new index carries every LRU, in another order
			q := routetest.Pool(t, n, nil)
			for k, e := range q.Endpoints {
				e.Name = p.Endpoints[(k+7)%n].Name
			}
			y := newPrefixIndex(64, 24, q)
			y.carry(x)
			x, p = y, q
		case r < 3: // an endpoint forgotten
			x.heads.clear(int32(i))
			x.lrus[i] = newBlockLRU(24)
			x.heads.bind(x.lrus[i], int32(i))
		default:
			x.recordAt(i, prompts[rnd.IntN(len(prompts))])
		}
		if step%50 == 0 {
			check(step)
		}
	}
	check(3000)
}
