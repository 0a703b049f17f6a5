package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"
)

// idleRows measures each HAProxy setup's memory with IdleConns idle
// keep-alive connections open, one setup at a time.
func idleRows(ctx context.Context, o CostOptions, targets []costTarget) ([]CostRow, error) {
	rows := make([]CostRow, 0, len(targets))
	for _, t := range targets {
		res, err := idleKeepAlive(ctx, t.Addr, t.Path, t.ProxyPIDs, t.Bodies, o.IdleConns)
		if err != nil {
			return nil, fmt.Errorf("idle %s: %w", t.Name, err)
		}
		o.Log.Info().Str("target", t.Name).Int("conns", res.Conns).Int("errors", res.Errors).
			Float64("before_mib", res.Before).Float64("with_mib", res.With).Msg("bench cost: idle keep-alive")
		rows = append(rows, CostRow{Group: t.Group, Target: t.Name, LoadGen: "idle keep-alive", Conns: res.Conns,
			Requests: res.Conns - res.Errors, Errors: res.Errors, Idle: true, IdleBefore: res.Before, ProxyRSS: res.With})
	}
	applyGroupBaselines(rows)
	return rows, nil
}

// sseProbe sends streaming requests one at a time, alternating the
// targets, and measures the time to the first body chunk: what a chat user
// waits for, and what http-no-delay and the routing hop affect.
func sseProbe(ctx context.Context, o CostOptions, targets []costTarget, bodies []CostBody) ([]CostRow, error) {
	clients := make([]*http.Client, len(targets))
	firsts := make([][]time.Duration, len(targets))
	for i := range clients {
		tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		defer tr.CloseIdleConnections()
		clients[i] = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	errs := make([]int, len(targets))
	buf := make([]byte, 32<<10)
	for n := range o.SSEProbes {
		for i, t := range targets {
			b := bodies[n%len(bodies)]
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+t.Addr+t.Path, bytes.NewReader(b.Body))
			if err != nil {
				return nil, fmt.Errorf("sse probe: %w", err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", b.Session)
			t0 := time.Now()
			resp, err := clients[i].Do(req)
			if err != nil {
				errs[i]++
				continue
			}
			var first time.Duration
			for {
				k, rerr := resp.Body.Read(buf)
				if k > 0 && first == 0 {
					first = time.Since(t0)
				}
				if rerr != nil {
					break
				}
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK || first == 0 {
				errs[i]++
				continue
			}
			firsts[i] = append(firsts[i], first)
		}
	}
	rows := make([]CostRow, len(targets))
	for i, t := range targets {
		s := Summarize(Millis(firsts[i]))
		rows[i] = CostRow{Group: t.Group, Target: t.Name, LoadGen: "sequential", Conns: 1,
			Requests: len(firsts[i]), Errors: errs[i], P50: s.P50, P99: s.P99, Probe: true}
	}
	applyGroupBaselines(rows)
	for i := range rows {
		rows[i].Ratio = 0 // not a throughput run
	}
	return rows, nil
}
