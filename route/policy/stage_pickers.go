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
func (rr *Rotation) Pick(c *Cycle) {
	c.Choice.Endpoints = rr.pick(c.Pool, c.Req.Only, c.Choice.Endpoints)
}

func (rr *Rotation) pick(p *fleet.Pool, only fleet.Mask, dst []*fleet.Endpoint) []*fleet.Endpoint {
	n := len(p.Endpoints)
	if n == 0 {
		return dst
	}
	start := int((rr.next.Add(1) - 1) % uint64(n))
	for i := 0; i < n && len(dst) < cap(dst); i++ {
		if e := p.Endpoints[(start+i)%n]; e.Available() && only.Has(e.Index) {
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
		if !c.Usable(e) || fleet.Contains(dst, e) || e == a {
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
// available endpoints not yet chosen, until the choice is full; ties go to
// the fewest decisions since the last scrape (FewerRecent), then to the
// earliest after a random rotation so equal loads spread (Rand nil: no
// rotation). It is MaxScore with LoadScore and FewerRecent, written out:
// it runs on every decision, so it skips the generic loop's indirect calls.
type LeastLoaded struct {
	Rand *fleet.Rand
	// WhenEmpty: it runs only when nothing has been picked yet, and then
	// sets OutcomeOverflow (LastResort).
	WhenEmpty bool
}

// NewLeastLoaded returns the least-loaded fill.
func NewLeastLoaded(rnd *fleet.Rand) *LeastLoaded { return &LeastLoaded{Rand: rnd} }

// LastResort is the least-loaded fill without rotation, run only when
// nothing was picked, with OutcomeOverflow: every replica the request's key
// allowed was over its bound, and the least loaded still serves.
func LastResort() *LeastLoaded { return &LeastLoaded{WhenEmpty: true} }

// Pick implements Picker.
func (ll *LeastLoaded) Pick(c *Cycle) {
	if ll.WhenEmpty {
		if c.Picked() > 0 {
			return
		}
		c.Choice.Outcome = fleet.OutcomeOverflow
	}
	eps, off := c.Rotated(ll.Rand) // drawn even when the choice is full, as always
	n := len(eps)
	if n == 0 {
		return
	}
	dst := c.Choice.Endpoints
	for len(dst) < cap(dst) {
		var best *fleet.Endpoint
		var bestLoad int64
		var bestRecent uint64
		for i := 0; i < n; i++ {
			e := eps[(i+off)%n]
			if !c.Usable(e) || fleet.Contains(dst, e) {
				continue
			}
			l := e.Load()
			if best != nil && l > bestLoad {
				continue
			}
			if r := e.Recent(); best == nil || l < bestLoad || r < bestRecent {
				best, bestLoad, bestRecent = e, l, r
			}
		}
		if best == nil {
			break
		}
		dst = append(dst, best)
	}
	c.Choice.Endpoints = dst
}

var (
	_ Picker = (*LeastLoaded)(nil)
	_ Picker = (*Rotation)(nil)
	_ Picker = (*P2C)(nil)
)
