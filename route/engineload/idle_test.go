package engineload

import (
	"context"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

// An idle replica (engine reports nothing running or waiting, no decision
// for it) is scraped at doubling gaps up to idle_interval; a decision for
// it, or a busy engine, brings back a scrape every round (issue 27: idle
// scrapes were most of an idle instance's CPU).
func TestScraperIdleBackoff(t *testing.T) {
	p := &page{}
	p.set("ok", vllmPage(0, 0, 0))
	srv := oneReplica(t, "{interval: 100ms, idle_interval: 800ms}", startPage(t, p))
	sc := New(srv, nil)
	ctx := context.Background()
	tgt := func() *target {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return sc.eps["m0"]
	}
	// rounds runs n rounds one after another (each scrape finished before
	// the next round) and returns which of them scraped.
	rounds := func(n int) (scraped []bool) {
		for range n {
			before := uint64(0)
			if t := tgt(); t != nil {
				before = t.attempts.Load()
			}
			sc.Round(ctx)
			waitFor(t, "scrape done", func() bool { return !tgt().busy.Load() })
			scraped = append(scraped, tgt().attempts.Load() > before)
		}
		return scraped
	}
	pattern := func(s []bool) string {
		b := make([]byte, len(s))
		for i, v := range s {
			b[i] = '.'
			if v {
				b[i] = 'S'
			}
		}
		return string(b)
	}
	// Gaps 1, 2, 4, then 8 intervals (idle_interval / interval), and stay.
	if got, want := pattern(rounds(24)), "SS.S...S.......S.......S"; got != want {
		t.Fatalf("idle rounds %s, want %s", got, want)
	}
	if tgt().skipped.Load() != 18 {
		t.Fatalf("skipped %d, want 18", tgt().skipped.Load())
	}
	// A decision for the replica (opened and closed between rounds) ends
	// the backoff at the next round.
	routeOnce(t, srv)
	if got := pattern(rounds(1)); got != "S" {
		t.Fatalf("rounds after a decision %s, want a scrape at once", got)
	}
	// A busy engine is scraped every round.
	p.set("ok", vllmPage(1, 0, 0.1))
	rounds(1) // may still be in a gap: the page changed without a decision
	rounds(8)
	if got := pattern(rounds(6)); got != "SSSSSS" {
		t.Fatalf("busy engine rounds %s, want every round", got)
	}
	// In flight here (the engine has not seen it yet) counts as busy.
	p.set("ok", vllmPage(0, 0, 0))
	ep := srv.Snapshot().Deployments[0].Serve.Endpoints[0]
	ep.AddInflight(1)
	if got := pattern(rounds(4)); got != "SSSS" {
		t.Fatalf("in-flight rounds %s, want every round", got)
	}
	ep.AddInflight(-1)
	// So does a peer's in-flight count (cluster sync).
	ep.AddPeerLoad(2)
	if got := pattern(rounds(4)); got != "SSSS" {
		t.Fatalf("peer-load rounds %s, want every round", got)
	}
	ep.AddPeerLoad(-2)
	if got := pattern(rounds(4)); got != "SS.S" {
		t.Fatalf("idle again %s, want SS.S", got)
	}
}

// idle_interval below interval is refused with its field named.
func TestIdleIntervalValidated(t *testing.T) {
	_, err := config.ParseConfig([]byte(`
engine_metrics: {interval: 1s, idle_interval: 500ms}
deployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]
`))
	if err == nil || !strings.Contains(err.Error(), "engine_metrics.idle_interval") {
		t.Fatalf("error %v, want one naming engine_metrics.idle_interval", err)
	}
}

// engine_metrics.share is on by default, can be turned off, and set on
// without cluster sync it is accepted with a warning naming it.
func TestShareConfig(t *testing.T) {
	const deps = "deployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]\n"
	cfg, err := config.ParseConfig([]byte(deps))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.EngineMetrics.Shared() {
		t.Fatal("engine_metrics.share is off by default")
	}
	if cfg, err = config.ParseConfig([]byte("engine_metrics: {share: false}\n" + deps)); err != nil || cfg.EngineMetrics.Shared() {
		t.Fatalf("share: false read as %v (err %v)", cfg != nil && cfg.EngineMetrics.Shared(), err)
	}
	cfg, err = config.ParseConfig([]byte("engine_metrics: {share: true}\n" + deps))
	if err != nil {
		t.Fatal(err)
	}
	warned := false
	for _, w := range cfg.Warnings() {
		warned = warned || w.Path == "engine_metrics.share"
	}
	if !warned {
		t.Fatalf("share: true without cluster.nats gave no warning: %v", cfg.Warnings())
	}
	if _, err := config.ParseConfig([]byte("engine_metrics: {share: maybe}\n" + deps)); err == nil || !strings.Contains(err.Error(), "share") {
		t.Fatalf("share: maybe: error %v, want one naming share", err)
	}
}
