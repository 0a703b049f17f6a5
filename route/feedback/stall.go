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
// whole stall. Each endpoint has a limit on the time to its first byte:
// health.stall.scale x the p99 of its recent first-token times (its pool's
// while it has too few), at least health.stall.floor, at most the budget
// (which also applies while no times are known). Three signals make an
// endpoint suspect:
//   - a feedback line whose ttfb= (time to the replica's response headers)
//     is over the limit;
//   - fleet.UnansweredSuspect completions in a row that ended before any
//     response headers (clients that give up early, whatever their timeout);
//   - a decision open longer than half the limit while no request started
//     after it has been answered in time (the decision sweep checks this; it
//     runs only while completions arrive, else every decision looks open).
// A suspect endpoint gets one probe, a 1-token completion with the limit as
// its timeout, so a long stream (open for minutes, but its first byte came
// early) is told apart from a stall. A probe that gets no answer in time
// degrades the endpoint: no new decisions until a later probe (every
// health.stall.readmit) answers in time. The last available endpoint of a
// pool is never degraded: a slow answer beats none.
//
// Worst case from the first stalled request to degraded: limit/2 + one
// sweep (limit/4, 100ms..1s) + the probe's limit, ~1.75x the limit (with
// the default 1s floor and fast replicas, ~2 s). The price: a replica
// whose streams outlast half its limit is probed about once per limit.

// checkStalls scales each endpoint's limit to its first-token times and
// starts the probes that suspect and degraded endpoints need.
func (l *Loop) checkStalls(ctx context.Context, snap *route.Snapshot, now time.Time) {
	sc := snap.Config.Health.Stall
	for _, d := range snap.Deployments {
		model := d.Name
		if len(d.Config.Models) > 0 {
			model = d.Config.Models[0]
		}
		for _, p := range d.Pools {
			scaleLimits(p, sc.Scale, sc.Floor.D(), now)
			for _, e := range p.Endpoints {
				ss := &e.State.Stall
				b := time.Duration(ss.Limit())
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

// scaleLimits sets each endpoint's limit to scale x the p99 of its recent
// first-token times, at least floor; an endpoint with too few borrows its
// pool's (a replica that stalls soon after it joins is still judged by
// its peers); with neither, the budget applies.
func scaleLimits(p *fleet.Pool, scale float64, floor time.Duration, now time.Time) {
	var (
		pool  [len(fleet.RequestBuckets) + 1]uint64
		poolN uint64
	)
	for _, e := range p.Endpoints {
		c, n := e.State.RecentFirstToken(now)
		for j := range pool {
			pool[j] += c[j]
		}
		poolN += n
	}
	poolP99, poolOK := fleet.P99(&pool, poolN)
	for _, e := range p.Endpoints {
		c, n := e.State.RecentFirstToken(now) // the same window: rotated above
		p99, ok := fleet.P99(&c, n)
		if !ok {
			p99, ok = poolP99, poolOK
		}
		if !ok {
			e.State.Stall.SetScaled(0)
			continue
		}
		e.State.Stall.SetScaled(max(floor, time.Duration(scale*float64(p99))))
	}
}

// errStalled is a probe that got no answer within the endpoint's limit.
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
