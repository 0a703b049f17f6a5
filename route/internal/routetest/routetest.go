// Package routetest holds test helpers shared by the route packages' tests
// (pools of fake endpoints, running a policy): test support, never imported
// by shipped code.
package routetest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Pool builds a pool of n endpoints named e0..e(n-1) with the policy.
func Pool(t testing.TB, n int, build func(p *fleet.Pool) fleet.Policy) *fleet.Pool {
	t.Helper()
	p := &fleet.Pool{Name: "d_mixed", Deployment: "d", Role: config.RoleMixed, Metrics: &fleet.PoolMetrics{}}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("e%d", i)
		p.Endpoints = append(p.Endpoints, &fleet.Endpoint{
			Name: name, Address: fmt.Sprintf("127.0.0.1:%d", 8000+i), Index: i, Seed: xxhash.Sum64String(name),
			NameHdr: []byte(name), AddrHdr: []byte(fmt.Sprintf("127.0.0.1:%d", 8000+i)), State: &fleet.State{},
		})
	}
	if build != nil {
		p.Policy = build(p)
	}
	return p
}

// Choose runs p's policy for r with room for n endpoints.
func Choose(p *fleet.Pool, r *fleet.Request, n int) *fleet.Choice {
	c := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, n)}
	p.Policy.Pick(r, p, c)
	return c
}

func Names(es []*fleet.Endpoint) string {
	var s []string
	for _, e := range es {
		s = append(s, e.Name)
	}
	return strings.Join(s, ",")
}
