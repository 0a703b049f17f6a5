package feedback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
)

// Passive stall detection. A replica that accepts requests and then stalls
// passes /health and keeps being chosen; every request sent to it waits the
// whole stall. Two signals make an endpoint suspect:
//   - a feedback line whose ttfb= (time to the replica's response headers)
//     is over the pool's budget;
//   - a decision open longer than half the budget while no request started
//     after it has been answered in time (the decision sweep checks this; it
//     runs only while completions arrive, else every decision looks open).
// A suspect endpoint gets one probe, a 1-token completion with the budget as
// its timeout, so a long stream (open for minutes, but its first byte came
// early) is told apart from a stall. A probe that gets no answer in time
// degrades the endpoint: no new decisions until a later probe (every
// health.stall.readmit) answers in time. The last available endpoint of a
// pool is never degraded: a slow answer beats none.
//
// Worst case from the first stalled request to degraded: budget/2 + one
// sweep (budget/4, 100ms..1s) + the probe's budget, ~1.75x the budget.

// checkStalls starts the probes that suspect and degraded endpoints need.
func (l *Loop) checkStalls(ctx context.Context, snap *route.Snapshot, now time.Time) {
	sc := snap.Config.Health.Stall
	for _, d := range snap.Deployments {
		model := d.Name
		if len(d.Config.Models) > 0 {
			model = d.Config.Models[0]
		}
		for _, p := range d.Pools {
			for _, e := range p.Endpoints {
				ss := &e.State.Stall
				b := time.Duration(ss.BudgetNs.Load())
				suspect := ss.Suspect.Swap(false)
				if b <= 0 {
					continue
				}
				sinceProbe := time.Duration(now.UnixNano() - ss.LastProbe.Load())
				switch {
				case ss.Degraded.Load():
					if sinceProbe < sc.Readmit.D() {
						continue
					}
				case !suspect || e.State.Down.Load() || sinceProbe < b:
					continue
				}
				if !ss.Probing.CompareAndSwap(false, true) {
					continue
				}
				ss.LastProbe.Store(now.UnixNano())
				go l.probeStall(ctx, p, e, model, sc.ProbePath, b)
			}
		}
	}
}

// errStalled is a probe that got no answer within the budget.
var errStalled = errors.New("no answer within the stall budget")

func (l *Loop) probeStall(ctx context.Context, p *fleet.Pool, e *fleet.Endpoint, model, path string, budget time.Duration) {
	ss := &e.State.Stall
	defer ss.Probing.Store(false)
	start := time.Now()
	err := l.probe(ctx, e, model, path, budget)
	took := time.Since(start)
	if ctx.Err() != nil {
		return
	}
	log := l.log.With().Str(fleet.FieldPool, p.Name).Str(fleet.FieldEndpoint, e.Name).Dur("budget", budget).Dur("probe", took).Logger()
	if !errors.Is(err, errStalled) {
		l.stallProbes[0].Add(1)
		if err != nil {
			// Refused, reset, 5xx: the health check's business, not a stall.
			log.Debug().Err(err).Msg("stall probe inconclusive")
		}
		if start.UnixNano() > ss.FastStart.Load() {
			ss.FastStart.Store(start.UnixNano())
		}
		if ss.Degraded.Swap(false) {
			log.Info().Msg("endpoint recovered: stall probe answered in time")
		}
		return
	}
	l.stallProbes[1].Add(1)
	if ss.Degraded.Load() {
		return
	}
	l.stallMu.Lock()
	defer l.stallMu.Unlock()
	others := false
	for _, o := range p.Endpoints {
		others = others || (o != e && o.Available())
	}
	if !others {
		if l.stallLastLog.allow(time.Now(), time.Minute) {
			log.Warn().Msg("endpoint stalls but is the last available one in its pool: kept")
		}
		return
	}
	ss.Since.Store(time.Now().UnixNano())
	ss.Degraded.Store(true)
	log.Warn().Str(fleet.FieldReason, "stalled").Msg("endpoint degraded: no new decisions until a probe answers in time")
}

// probe sends a 1-token completion and waits for the response headers.
func (l *Loop) probe(ctx context.Context, e *fleet.Endpoint, model, path string, budget time.Duration) error {
	body, err := json.Marshal(map[string]any{"model": model, "prompt": "ping", "max_tokens": 1, "stream": false})
	if err != nil {
		return fmt.Errorf("probe body: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodPost, "http://"+e.Address+path, strings.NewReader(string(body)))
	if err != nil {
		return fmt.Errorf("probe request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := l.probeClient.Do(req)
	if err != nil {
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			return fmt.Errorf("probe %s: %w", e.Name, errStalled)
		}
		return fmt.Errorf("probe %s: %w", e.Name, err)
	}
	_ = res.Body.Close()
	if res.StatusCode >= 500 {
		return fmt.Errorf("probe %s: status %d", e.Name, res.StatusCode)
	}
	return nil
}
