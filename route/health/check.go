package health

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
)

// Checker runs a Decider's active health checks and the served-model
// check; it changes endpoints' health state, never a decision.
type Checker struct {
	d   *route.Decider
	log *zerolog.Logger
	// upWake tells the served-model poll that an endpoint came up.
	upWake chan struct{}
}

// New returns the health checker of d (Run and CheckServedModels start it).
func New(d *route.Decider) *Checker {
	return &Checker{d: d, log: d.Log(), upWake: make(chan struct{}, 1)}
}

// wakeModels asks the served-model poll for a pass now (never blocks).
func (c *Checker) wakeModels() {
	select {
	case c.upWake <- struct{}{}:
	default:
	}
}

// Run actively checks every endpoint's health path until ctx ends, so
// turnout stops choosing a dead replica even where the proxy has no checks
// of its own (nginx OSS). An endpoint goes down after Fails consecutive
// failures and up again on the first success; one never seen healthy goes
// down at its first failure (there is no flapping to smooth over yet).
func (c *Checker) Run(ctx context.Context) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true}}
	for {
		snap := c.d.Snapshot()
		hc := snap.Config.Health
		if hc.Disable || hc.Interval.D() <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second): // config may enable checks later
			}
			continue
		}
		var wg sync.WaitGroup
		for _, p := range snap.Pools() {
			for _, e := range p.Endpoints {
				wg.Add(1)
				go func(e *fleet.Endpoint) {
					defer wg.Done()
					c.checkOne(ctx, client, e, hc)
				}(e)
			}
		}
		wg.Wait()
		if ctx.Err() == nil {
			c.d.Health().HealthRoundDone()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(hc.Interval.D()):
		}
	}
}

func (c *Checker) checkOne(ctx context.Context, client *http.Client, e *fleet.Endpoint, hc config.HealthConfig) {
	cctx, cancel := context.WithTimeout(ctx, hc.Timeout.D())
	defer cancel()
	ok := false
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+e.Address+hc.Path, nil)
	if err == nil {
		if resp, err := client.Do(req); err == nil {
			ok = resp.StatusCode >= 200 && resp.StatusCode < 300
			_ = resp.Body.Close()
		}
	}
	if ctx.Err() != nil {
		return
	}
	defer e.State.Checked.Store(true)
	if ok {
		c.d.Health().NoteHealthCheck(true)
		first := !e.State.SeenUp.Swap(true)
		if first {
			e.State.UpAt.Store(time.Now().UnixNano())
		}
		e.State.Fails.Store(0)
		wasDown := e.State.Down.Swap(false)
		if wasDown {
			c.log.Info().Str(fleet.FieldEndpoint, e.Name).Msg("endpoint up")
		}
		if first || wasDown {
			c.wakeModels() // its list may be unknown or changed: ask now
		}
		return
	}
	c.d.Health().NoteHealthCheck(false)
	if (int(e.State.Fails.Add(1)) >= hc.Fails || !e.State.SeenUp.Load()) && !e.State.Down.Swap(true) {
		c.log.Warn().Str(fleet.FieldEndpoint, e.Name).Str(fleet.FieldReason, "health check failed").Msg("endpoint down")
	}
}
