package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
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

// stallState is an endpoint's stall detection state (atomics: not copied).
type stallState struct {
	budgetNs atomic.Int64 // 0 = off; set by each snapshot
	degraded atomic.Bool
	suspect  atomic.Bool
	probing  atomic.Bool
	// lastProbe is when the last probe started (unix ns).
	lastProbe atomic.Int64
	// fastStart is the start (unix ns) of the latest request known to have
	// been answered within the budget (feedback or probe).
	fastStart atomic.Int64
	// since is when the endpoint was degraded (unix ns).
	since atomic.Int64
}

// setStallBudget applies a pool's budget to its endpoints; an endpoint whose
// detection is turned off is no longer held degraded.
func setStallBudget(p *Pool, budget time.Duration) {
	for _, e := range p.Endpoints {
		e.st.stall.budgetNs.Store(int64(budget))
		if budget <= 0 {
			e.st.stall.degraded.Store(false)
		}
	}
}

// onFeedback takes one completion's times (ms, -1 = unknown).
func (ss *stallState) onFeedback(ms, ttfb, now int64) {
	b := ss.budgetNs.Load()
	if b <= 0 {
		return
	}
	budgetMs := b / int64(time.Millisecond)
	if ttfb >= budgetMs {
		ss.suspect.Store(true)
		return
	}
	if ttfb < 0 && (ms < 0 || ms >= budgetMs) {
		return // no first-byte time and a total too long to tell
	}
	start := now - max(ms, ttfb)*int64(time.Millisecond)
	if start > ss.fastStart.Load() {
		ss.fastStart.Store(start)
	}
}

// Degraded reports whether stall detection took the endpoint out.
func (e *Endpoint) Degraded() bool { return e.st.stall.degraded.Load() }

// stallTick is how often decisions are swept: a quarter of the smallest
// budget, within 100ms..1s (1s, the TTL sweep, when detection is off).
func stallTick(snap *Snapshot) time.Duration {
	t := time.Second
	for _, p := range snap.Pools() {
		if len(p.Endpoints) == 0 {
			continue
		}
		if b := time.Duration(p.Endpoints[0].st.stall.budgetNs.Load()); b > 0 {
			t = min(t, max(b/4, 100*time.Millisecond))
		}
	}
	return t
}

// checkStalls starts the probes that suspect and degraded endpoints need.
func (s *Server) checkStalls(ctx context.Context, snap *Snapshot, now time.Time) {
	sc := snap.Config.Health.Stall
	for _, d := range snap.Deployments {
		model := d.Name
		if len(d.Config.Models) > 0 {
			model = d.Config.Models[0]
		}
		for _, p := range d.Pools {
			for _, e := range p.Endpoints {
				ss := &e.st.stall
				b := time.Duration(ss.budgetNs.Load())
				suspect := ss.suspect.Swap(false)
				if b <= 0 {
					continue
				}
				sinceProbe := time.Duration(now.UnixNano() - ss.lastProbe.Load())
				switch {
				case ss.degraded.Load():
					if sinceProbe < sc.Readmit.D() {
						continue
					}
				case !suspect || e.st.down.Load() || sinceProbe < b:
					continue
				}
				if !ss.probing.CompareAndSwap(false, true) {
					continue
				}
				ss.lastProbe.Store(now.UnixNano())
				go s.probeStall(ctx, p, e, model, sc.ProbePath, b)
			}
		}
	}
}

// errStalled is a probe that got no answer within the budget.
var errStalled = errors.New("no answer within the stall budget")

func (s *Server) probeStall(ctx context.Context, p *Pool, e *Endpoint, model, path string, budget time.Duration) {
	ss := &e.st.stall
	defer ss.probing.Store(false)
	start := time.Now()
	err := s.probe(ctx, e, model, path, budget)
	took := time.Since(start)
	if ctx.Err() != nil {
		return
	}
	log := s.log.With().Str(fieldPool, p.Name).Str(fieldEndpoint, e.Name).Dur("budget", budget).Dur("probe", took).Logger()
	if !errors.Is(err, errStalled) {
		s.m.stallProbes[0].Add(1)
		if err != nil {
			// Refused, reset, 5xx: the health check's business, not a stall.
			log.Debug().Err(err).Msg("stall probe inconclusive")
		}
		if start.UnixNano() > ss.fastStart.Load() {
			ss.fastStart.Store(start.UnixNano())
		}
		if ss.degraded.Swap(false) {
			log.Info().Msg("endpoint recovered: stall probe answered in time")
		}
		return
	}
	s.m.stallProbes[1].Add(1)
	if ss.degraded.Load() {
		return
	}
	s.stallMu.Lock()
	defer s.stallMu.Unlock()
	others := false
	for _, o := range p.Endpoints {
		others = others || (o != e && o.Available())
	}
	if !others {
		if s.stallLastLog.allow(time.Now(), time.Minute) {
			log.Warn().Msg("endpoint stalls but is the last available one in its pool: kept")
		}
		return
	}
	ss.since.Store(time.Now().UnixNano())
	ss.degraded.Store(true)
	log.Warn().Str(fieldReason, "stalled").Msg("endpoint degraded: no new decisions until a probe answers in time")
}

// probe sends a 1-token completion and waits for the response headers.
func (s *Server) probe(ctx context.Context, e *Endpoint, model, path string, budget time.Duration) error {
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
	res, err := s.probeClient.Do(req)
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
