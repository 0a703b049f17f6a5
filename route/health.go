package route

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// RunHealth actively checks every endpoint's health path until ctx ends, so
// turnout stops choosing a dead replica even where the proxy has no checks
// of its own (nginx OSS). An endpoint goes down after Fails consecutive
// failures and up again on the first success; one never seen healthy goes
// down at its first failure (there is no flapping to smooth over yet).
func (s *Server) RunHealth(ctx context.Context) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true}}
	for {
		snap := s.snap.Load()
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
					s.checkOne(ctx, client, e, hc)
				}(e)
			}
		}
		wg.Wait()
		if ctx.Err() == nil {
			s.healthRound.Store(true)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(hc.Interval.D()):
		}
	}
}

func (s *Server) checkOne(ctx context.Context, c *http.Client, e *fleet.Endpoint, hc config.HealthConfig) {
	cctx, cancel := context.WithTimeout(ctx, hc.Timeout.D())
	defer cancel()
	ok := false
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+e.Address+hc.Path, nil)
	if err == nil {
		if resp, err := c.Do(req); err == nil {
			ok = resp.StatusCode >= 200 && resp.StatusCode < 300
			_ = resp.Body.Close()
		}
	}
	if ctx.Err() != nil {
		return
	}
	defer e.State.Checked.Store(true)
	if ok {
		s.m.health[0].Add(1)
		e.State.SeenUp.Store(true)
		e.State.Fails.Store(0)
		if e.State.Down.Swap(false) {
			s.log.Info().Str(fleet.FieldEndpoint, e.Name).Msg("endpoint up")
		}
		return
	}
	s.m.health[1].Add(1)
	if (int(e.State.Fails.Add(1)) >= hc.Fails || !e.State.SeenUp.Load()) && !e.State.Down.Swap(true) {
		s.log.Warn().Str(fleet.FieldEndpoint, e.Name).Str(fleet.FieldReason, "health check failed").Msg("endpoint down")
	}
}
