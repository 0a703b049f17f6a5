package policy

import (
	"github.com/turnout/turnout/route/fleet"
	"sync/atomic"
)

// Rotation picks available endpoints in turn (round robin); fallbacks
// continue the rotation.
type Rotation struct {
	next atomic.Uint64
}

// Pick implements Picker.
func (rr *Rotation) Pick(c *Cycle) { c.Choice.Endpoints = rr.pick(c.Pool, c.Choice.Endpoints) }

func (rr *Rotation) pick(p *fleet.Pool, dst []*fleet.Endpoint) []*fleet.Endpoint {
	n := len(p.Endpoints)
	if n == 0 {
		return dst
	}
	start := int((rr.next.Add(1) - 1) % uint64(n))
	for i := 0; i < n && len(dst) < cap(dst); i++ {
		if e := p.Endpoints[(start+i)%n]; e.Available() {
			dst = append(dst, e)
		}
	}
	return dst
}

// P2C is power-of-two-choices over Endpoint.Load: two random available
// endpoints, the less loaded wins, a tie is broken at random. P2C rather
// than a global minimum so several turnout instances with slightly
// different views do not all herd onto the same replica. When fewer than
// two are found it picks nothing and leaves the request to the next
// picker (the least-loaded fill).
type P2C struct {
	Rand *fleet.Rand
}

// Pick implements Picker.
func (p2 *P2C) Pick(c *Cycle) {
	dst := c.Choice.Endpoints
	if len(dst) == cap(dst) {
		return
	}
	eps := c.Pool.Endpoints
	n := len(eps)
	if n == 0 {
		return
	}
	// Draw two distinct available endpoints; bounded probing keeps this O(n)
	// in the worst case when most endpoints are down.
	var a, b *fleet.Endpoint
	start := p2.Rand.Intn(n)
	step := 1 + p2.Rand.Intn(max(n-1, 1))
	for i := 0; i < n; i++ {
		e := eps[(start+i*step)%n]
		if !e.Available() || fleet.Contains(dst, e) || e == a {
			continue
		}
		if a == nil {
			a = e
			continue
		}
		b = e
		break
	}
	if a == nil || b == nil {
		return // step may not be coprime with n: the fill scans
	}
	la, lb := a.Load(), b.Load()
	if lb < la || (la == lb && p2.Rand.Uint64()&1 == 1) {
		a = b
	}
	c.Choice.Endpoints = append(dst, a)
}

// LeastLoaded is the fill every preset ends with: the least loaded
// available endpoints (ties: fewer recent decisions, then a random
// rotation so equal loads spread) until the choice is full.
func LeastLoaded(rnd *fleet.Rand) *MaxScore {
	return &MaxScore{Name: "least-loaded", Scorers: []Weighted{{LoadScore{}, 1}}, Ties: []Tie{FewerRecent{}}, Rand: rnd}
}

// LastResort is LeastLoaded without rotation, run only when nothing was
// picked, with OutcomeOverflow: every replica the request's key allowed
// was over its bound, and the least loaded still serves.
func LastResort() *MaxScore {
	return &MaxScore{Name: "last-resort", Scorers: []Weighted{{LoadScore{}, 1}}, Ties: []Tie{FewerRecent{}},
		WhenEmpty: true, SetsOutcome: true, Outcome: fleet.OutcomeOverflow}
}

var (
	_ Picker = (*Rotation)(nil)
	_ Picker = (*P2C)(nil)
)
