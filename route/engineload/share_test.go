package engineload

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/turnout/turnout/route/fleet"
)

// fakeShare is a cluster of two: this instance owns the replicas in own.
type fakeShare struct {
	mu        sync.Mutex
	own       map[string]bool
	published map[string]int
	flushes   int
	fn        func([]byte, *fleet.EngineLoad, time.Duration)
}

func (f *fakeShare) Owns(ep string) bool { f.mu.Lock(); defer f.mu.Unlock(); return f.own[ep] }
func (f *fakeShare) Publish(ep string, _ *fleet.EngineLoad, _ time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.published[ep]++
}
func (f *fakeShare) Flush() { f.mu.Lock(); f.flushes++; f.mu.Unlock() }
func (f *fakeShare) OnFigures(fn func([]byte, *fleet.EngineLoad, time.Duration)) {
	f.fn = fn
}

var _ Share = (*fakeShare)(nil)

// With engine_metrics.share, an owned replica is scraped and its figures
// published; another's is not scraped while its owner's figures are
// fresh (they become the endpoint's engine load), and is scraped again
// once they are older than two of the owner's gaps.
func TestScraperShare(t *testing.T) {
	p := &page{}
	p.set("ok", vllmPage(3, 1, 0.2))
	srv := oneReplica(t, "{interval: 100ms, idle_interval: 100ms}", startPage(t, p))
	sc := New(srv, nil)
	fs := &fakeShare{own: map[string]bool{"m0": true}, published: map[string]int{}}
	sc.SetShare(fs)
	var clock time.Time
	var clockMu sync.Mutex
	clock = time.Now()
	sc.now = func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
	advance := func(d time.Duration) { clockMu.Lock(); clock = clock.Add(d); clockMu.Unlock() }
	ctx := context.Background()
	tgt := func() *target { sc.mu.Lock(); defer sc.mu.Unlock(); return sc.eps["m0"] }
	round := func() {
		sc.Round(ctx)
		waitFor(t, "scrape done", func() bool { return !tgt().busy.Load() })
	}
	ep := srv.Snapshot().Deployments[0].Serve.Endpoints[0]

	// Owned: scraped and published.
	round()
	if got := tgt().results[ResultOK].Load(); got != 1 {
		t.Fatalf("owned replica scraped %d times, want 1", got)
	}
	fs.mu.Lock()
	pub, fl := fs.published["m0"], fs.flushes
	fs.mu.Unlock()
	if pub != 1 || fl != 1 {
		t.Fatalf("published %d, flushed %d; want 1, 1", pub, fl)
	}

	// Another instance owns it: its figures arrive and stand for a scrape.
	fs.mu.Lock()
	fs.own["m0"] = false
	fs.mu.Unlock()
	fs.fn([]byte("m0"), &fleet.EngineLoad{Requests: 9, Waiting: 2, KVUsage: 0.5}, 100*time.Millisecond)
	if el := ep.Engine(); el == nil || el.Requests != 9 || el.Waiting != 2 {
		t.Fatalf("engine load after the owner's figures %+v, want requests 9, waiting 2", el)
	}
	for range 3 {
		round()
		advance(50 * time.Millisecond)
	}
	if got := tgt().results[ResultOK].Load(); got != 1 {
		t.Fatalf("replica scraped %d times while the owner's figures were fresh, want 1 (the first)", got)
	}
	if tgt().shared.Load() != 1 || tgt().fallback.Load() != 0 {
		t.Fatalf("shared %d fallback %d, want 1, 0", tgt().shared.Load(), tgt().fallback.Load())
	}
	// The owner went quiet: past two gaps, this instance scrapes itself.
	advance(100 * time.Millisecond)
	round()
	if got := tgt().results[ResultOK].Load(); got != 2 {
		t.Fatalf("replica scraped %d times after the owner's figures went stale, want 2", got)
	}
	if tgt().fallback.Load() != 1 {
		t.Fatalf("fallback %d, want 1", tgt().fallback.Load())
	}
	if el := ep.Engine(); el == nil || el.Requests != 4 {
		t.Fatalf("engine load after the fallback scrape %+v, want requests 4 (the page)", el)
	}
	fs.mu.Lock()
	pub = fs.published["m0"]
	fs.mu.Unlock()
	if pub != 1 {
		t.Fatalf("a fallback scrape was published (%d): only owners publish", pub)
	}

	// Figures for an owner at its idle gap last two of those gaps, unless
	// this instance sends the replica requests meanwhile.
	fs.fn([]byte("m0"), &fleet.EngineLoad{Requests: 0, KVUsage: 0}, time.Second)
	advance(1500 * time.Millisecond)
	round()
	if got := tgt().results[ResultOK].Load(); got != 2 {
		t.Fatalf("scraped %d, want 2: idle figures 1.5 s old with a 1 s gap still stand", got)
	}
	routeOnce(t, srv)
	round()
	if got := tgt().results[ResultOK].Load(); got != 3 {
		t.Fatalf("scraped %d, want 3: a request here makes 1.5 s old figures stale", got)
	}
	// A failed scrape at the owner takes the figure away here too.
	fs.fn([]byte("m0"), nil, 100*time.Millisecond)
	if el := ep.Engine(); el != nil {
		t.Fatalf("engine load after the owner's failed scrape %+v, want none", el)
	}
}
