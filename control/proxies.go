package control

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
)

// syncer brings one proxy in line with an applied config: plan, then apply
// (HAProxy: runtime API commands, a reload only for a stated reason; nginx:
// re-render, and reload when the render changed, with the reason).
type syncer interface {
	Sync(ctx context.Context, cfg *config.Config) error
}

// syncReq is a config for the proxies and the listener changes it makes
// obsolete: those close only after the proxies moved away from them.
type syncReq struct {
	cfg     *config.Config
	retired []*change
}

// proxies is the proxy worker: syncs run in its one goroutine, newest
// config wins, so a slow drain never blocks the decision path or piles up.
type proxies struct {
	log     *zerolog.Logger
	lns     *listeners
	syncers []syncer
	pushMu  sync.Mutex // one push at a time keeps "newest wins" exact
	ch      chan syncReq
	// pending are replaced listeners kept open while syncs fail (worker only).
	pending []*change
}

// managed reports whether any proxy is synced.
func (p *proxies) managed() bool { return len(p.syncers) > 0 }

// push hands cfg to the worker, replacing a config it has not taken yet
// (whose retired listeners ride along, and whose drain, if longer, stays:
// the servers that config removed are removed by this one too).
func (p *proxies) push(c *config.Config, ch *change) {
	p.pushMu.Lock()
	defer p.pushMu.Unlock()
	req := syncReq{cfg: c}
	select {
	case old := <-p.ch:
		req.retired = old.retired
		if d := old.cfg.HAProxy.DrainTimeout; d > c.HAProxy.DrainTimeout {
			cp := *c
			cp.HAProxy.DrainTimeout = d
			req.cfg = &cp
		}
	default:
	}
	if ch != nil {
		req.retired = append(req.retired, ch)
	}
	p.ch <- req
}

// run is the worker: each config goes to every proxy side by side (an
// nginx reload or an HAProxy drain does not hold the other proxy's pool
// change back), then the listeners it replaced retire.
func (p *proxies) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case req := <-p.ch:
			var (
				failed atomic.Bool
				wg     sync.WaitGroup
			)
			for _, s := range p.syncers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := s.Sync(ctx, req.cfg); err != nil {
						failed.Store(true)
						p.log.Error().Err(err).Msg("proxy sync failed")
					}
				}()
			}
			wg.Wait()
			p.pending = append(p.pending, req.retired...)
			if failed.Load() && len(p.pending) > 0 {
				p.log.Warn().Msg("proxy sync failed: replaced listeners stay open until a sync succeeds")
				continue
			}
			for _, ch := range p.pending {
				p.lns.retire(ch, syncedGrace, req.cfg.Proxy.StreamTimeout.D())
			}
			p.pending = nil
		}
	}
}
