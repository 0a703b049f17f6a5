package models

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// LoadOn loads adapter name on e, the endpoint deployment dep (config dc)
// picked for it, within lora.load_timeout, and reports whether it is
// served now; every load and unload is counted in stats and logged. The
// adapter a full endpoint unloads to make room goes in the background,
// bounded by the same timeout under ctx.
func (l *Loader) LoadOn(ctx context.Context, log *zerolog.Logger, stats *Stats, dep string, dc *config.DeploymentConfig, e *fleet.Endpoint, name string) bool {
	timeout := dc.LoRA.LoadTimeout.D()
	if timeout <= 0 {
		timeout = DefaultLoadTimeout
	}
	if !l.mayLoad(dep, dc) {
		stats.noteLimited(dep)
		return false
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	evict, err := l.Load(lctx, dc, e, name)
	stats.noteLoad(dep, name, err == nil)
	if err != nil {
		log.Warn().Err(err).Str(fleet.FieldDeployment, dep).Str(fleet.FieldEndpoint, e.Name).Str("adapter", name).
			Msg("lora: load on demand failed; the request is refused as if nothing served the adapter")
		return false
	}
	log.Info().Str(fleet.FieldDeployment, dep).Str(fleet.FieldEndpoint, e.Name).Str("adapter", name).
		Dur("took", time.Since(start)).Str("unloads", evict).Msg("lora: adapter loaded on demand")
	addServed(e, fleet.ServedModel{ID: name, Parent: dc.Models[0]}, evict)
	if evict != "" {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := l.Unload(ctx, e.Address, evict); err != nil {
				log.Warn().Err(err).Str(fleet.FieldEndpoint, e.Name).Str("adapter", evict).Msg("lora: unload of a cold adapter failed")
				return
			}
			stats.noteUnload(dep, evict)
		}()
	}
	return true
}

// addServed adds m to e's model list (and drops evict), as the next
// /v1/models poll will find it.
func addServed(e *fleet.Endpoint, m fleet.ServedModel, evict string) {
	next := &fleet.ServedModels{Source: fleet.ModelsListed}
	if old := e.ServedModels(); old != nil {
		next.Source = old.Source
		for _, o := range old.Models {
			if o.ID != m.ID && o.ID != evict {
				next.Models = append(next.Models, o)
			}
		}
	}
	next.Models = append(next.Models, m)
	e.SetServed(next)
}

// noteLoad and noteUnload count lora.load_on_demand's calls.
// A failed load counts under the adapter's own name only when the name
// exists (the table routes it); else in the one overflow series.
func (s *Stats) noteLoad(dep, adapter string, ok bool) {
	if ok {
		s.For(adapter, dep, true).Loads.Add(1)
		return
	}
	s.existing(adapter, dep).LoadFailures.Add(1)
}

// noteLimited counts a load lora.max_loads_per_minute did not start.
func (s *Stats) noteLimited(dep string) {
	s.mu.Lock()
	c := s.limited[dep]
	if c == nil {
		c = new(atomic.Uint64)
		s.limited[dep] = c
	}
	s.mu.Unlock()
	c.Add(1)
}

func (s *Stats) noteUnload(dep, adapter string) { s.For(adapter, dep, true).Unloads.Add(1) }
