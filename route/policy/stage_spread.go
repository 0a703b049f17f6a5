package policy

import "github.com/turnout/turnout/route/fleet"

// PeerSpread places a request that no earlier picker placed when other
// turnout instances send to the same replicas (cluster sync, issue 27):
// at random among the usable endpoints at most Slack above the lowest
// load, instead of at the lowest load itself. Fronts see each other's
// decisions only after the sync's delay, so between two updates every
// front sees the same least-loaded replica and a global minimum sends
// them all there at once (herding: the queue the picks meant to avoid).
// Choosing among the nearly least loaded at random, each front drawing
// from its own source, spreads concurrent picks (Mitzenmacher, "How
// useful is old information?": with stale loads, the strict minimum is
// the worst choice). A lone instance (no peer decision ever counted) is
// left to the least-loaded fill: it sees its own picks at once.
type PeerSpread struct {
	Rand  *fleet.Rand
	Slack int64
}

// Pick implements Picker. Allocation-free: two passes over the pool.
func (p *PeerSpread) Pick(c *Cycle) {
	if c.Picked() > 0 || !c.Room() || c.N < 2 {
		return
	}
	eps := c.Pool.Endpoints
	peers, k := false, 0
	for _, e := range eps {
		if !c.Usable(e) {
			continue
		}
		peers = peers || e.PeerActive()
		if e.Load() <= c.MinLoad+p.Slack {
			k++
		}
	}
	if !peers || k < 2 {
		return
	}
	j := p.Rand.Intn(k)
	for _, e := range eps {
		if c.Usable(e) && e.Load() <= c.MinLoad+p.Slack {
			if j == 0 {
				c.Choice.Endpoints = append(c.Choice.Endpoints, e)
				return
			}
			j--
		}
	}
	// Loads moved between the passes: the fill places the request.
}

var _ Picker = (*PeerSpread)(nil)
