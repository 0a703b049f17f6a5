package hints

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
)

// Window is how much traffic a verdict on a pool's prompts needs: at least
// minDecisions decisions over at least window.
const (
	window       = time.Minute
	minDecisions = 20
	// shortShare is the share of prompts shorter than one block past which
	// the pool is said to have nothing to match; below rearmShare the hint
	// may be said again later.
	shortShare = 0.9
	rearmShare = 0.5
)

// Prefix logs a warning when most prompts a prefix-keyed pool saw over the
// last window were shorter than its block_bytes (counted in
// turnout_prefix_short_prompts_total): nothing is hashed, so the policy
// never finds a prefix, and the operator sees only "balanced" outcomes.
type Prefix struct {
	log   *zerolog.Logger
	pools map[string]*poolWatch // by deployment/pool
}

type poolWatch struct {
	since          time.Time
	decided, short uint64 // counters at since
	said           bool
}

// NewPrefix returns the watcher; Register hooks it on d's ticker.
func NewPrefix(log *zerolog.Logger) *Prefix {
	return &Prefix{log: log, pools: map[string]*poolWatch{}}
}

// Register runs the check on every tick of d's ticker.
func (h *Prefix) Register(d *route.Decider) { d.Ticker().OnTick(h.Tick) }

// Tick checks every pool whose policy hashes prompts. Ticks come from one
// goroutine (the Ticker's), so the watcher needs no lock.
func (h *Prefix) Tick(_ context.Context, snap *route.Snapshot, now time.Time) {
	for _, p := range snap.Pools() {
		if p.BlockBytes <= 0 {
			continue
		}
		key := p.Deployment + "/" + p.Name
		decided, short := decisions(p), p.Metrics.ShortPrompts.Load()
		w := h.pools[key]
		if w == nil || decided < w.decided || short < w.short {
			h.pools[key] = &poolWatch{since: now, decided: decided, short: short}
			continue
		}
		n := decided - w.decided
		if now.Sub(w.since) < window || n < minDecisions {
			continue
		}
		share := float64(short-w.short) / float64(n)
		switch {
		case share >= shortShare && !w.said:
			h.log.Warn().Str("deployment", p.Deployment).Str("pool", p.Name).
				Int("block_bytes", p.BlockBytes).Float64("short_share", share).Uint64("decisions", n).
				Msgf("prefix policy of pool %s: %.0f%% of the last %d prompts were shorter than one block (%d bytes), so there was no prefix to match and they were balanced by load; lower block_bytes (64 suits system prompts of a few hundred characters; docs/policies.md, short prompts)",
					p.Name, share*100, n, p.BlockBytes)
			w.said = true
		case share < rearmShare:
			w.said = false
		}
		w.since, w.decided, w.short = now, decided, short
	}
}

// decisions is how many decisions the pool's policy made.
func decisions(p *fleet.Pool) uint64 {
	var n uint64
	for i := range p.Metrics.Outcomes {
		n += p.Metrics.Outcomes[i].Load()
	}
	return n
}
