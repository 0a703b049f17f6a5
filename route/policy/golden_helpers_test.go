package policy

import (
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// goldenPool is a pool of n endpoints e0..e(n-1) with fresh state.
func goldenPool(n int) *fleet.Pool {
	p := &fleet.Pool{Name: "d_mixed", Deployment: "d", Role: config.RoleMixed, Metrics: &fleet.PoolMetrics{}}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("e%d", i)
		addr := fmt.Sprintf("127.0.0.1:%d", 8000+i)
		p.Endpoints = append(p.Endpoints, &fleet.Endpoint{
			Name: name, Address: addr, Index: i, Seed: xxhash.Sum64String(name),
			NameHdr: []byte(name), AddrHdr: []byte(addr), State: &fleet.State{},
		})
	}
	return p
}

// goldenOpen counts a decision for e as the decision ledger does.
func goldenOpen(e *fleet.Endpoint) {
	e.State.Inflight.Add(1)
	e.State.Decisions.Add(1)
}
