package route

import (
	"fmt"
	"testing"
	"time"
)

// The idle sweep skip (issue 27): the ledger may hold an open decision
// exactly while more were opened than closed in any way; each way of
// closing has its row, so dropping a term from the count fails its row.
func TestDecisionsMayHoldOpen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(t *testing.T, s *Decider, ids []uint64)
	}{
		{"completed", func(t *testing.T, s *Decider, ids []uint64) {
			for _, id := range ids {
				if !s.Ledger().Complete(id) {
					t.Fatalf("decision %x not completed", id)
				}
			}
		}},
		{"expired", func(t *testing.T, s *Decider, ids []uint64) {
			s.dec.sweep(time.Now().Add(time.Hour), time.Minute, false)
		}},
		{"reconciled", func(t *testing.T, s *Decider, ids []uint64) {
			// No engine figure: reconcile keeps none open.
			if n := s.dec.reconcile(time.Now().Add(time.Hour).UnixNano()); n != uint64(len(ids)) {
				t.Fatalf("reconciled %d of %d", n, len(ids))
			}
		}},
		{"abandoned", func(t *testing.T, s *Decider, ids []uint64) {
			for _, id := range ids {
				if !s.Ledger().Abandon(id) {
					t.Fatalf("decision %x not abandoned", id)
				}
			}
		}},
		{"overwritten", func(t *testing.T, s *Decider, ids []uint64) {
			// A full ring of new decisions overwrites every open slot; then
			// the new ones complete.
			e := s.Snapshot().Deployments[0].Serve.Endpoints[0]
			var fresh []uint64
			for range s.dec.slots {
				fresh = append(fresh, s.dec.open(e, time.Now().UnixNano(), &decisionMeta{model: -1}))
			}
			if s.dec.overwritten.Load() != uint64(len(ids)) {
				t.Fatalf("overwritten %d, want %d", s.dec.overwritten.Load(), len(ids))
			}
			if !s.dec.mayHoldOpen() {
				t.Fatal("ring full of open decisions, mayHoldOpen false")
			}
			for _, id := range fresh {
				s.Ledger().Complete(id)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
			s.dec = newDecisions(8, 1)
			if s.dec.mayHoldOpen() {
				t.Fatal("fresh ledger may hold an open decision")
			}
			e := s.Snapshot().Deployments[0].Serve.Endpoints[0]
			var ids []uint64
			for range 3 {
				ids = append(ids, s.dec.open(e, time.Now().UnixNano(), &decisionMeta{model: -1}))
			}
			if !s.dec.mayHoldOpen() {
				t.Fatal("3 open decisions, mayHoldOpen false: the sweep would skip them")
			}
			tc.close(t, s, ids)
			if s.dec.mayHoldOpen() {
				t.Fatalf("every decision closed (%s), mayHoldOpen still true: the idle sweep walks the ring", tc.name)
			}
			if got := e.State.Inflight.Load(); got != 0 {
				t.Fatalf("in flight %d after closing", got)
			}
		})
	}
}

// The sweep walks only the slots that may hold an open decision: none
// when idle, the window from the oldest open decision to the newest
// under load, every open decision still (expired or flagged).
func TestLedgerSweepVisits(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	s.dec = newDecisions(1<<16, 7)
	e := s.Snapshot().Deployments[0].Serve.Endpoints[0]
	now := time.Now()
	open := func() uint64 { return s.dec.open(e, now.UnixNano(), &decisionMeta{model: -1}) }
	visits := func(at time.Time) uint64 {
		before := s.dec.visited.Load()
		s.dec.sweep(at, time.Minute, false)
		return s.dec.visited.Load() - before
	}
	if v := visits(now); v != 0 {
		t.Fatalf("idle sweep visited %d slots, want 0", v)
	}
	// One long decision, then 100 that come and go.
	long := open()
	for range 100 {
		s.Ledger().Complete(open())
	}
	if v := visits(now); v != 101 {
		t.Fatalf("sweep with one open decision 100 behind the newest visited %d slots, want 101", v)
	}
	// Ten more come and go: the window still starts at the long one.
	for range 10 {
		s.Ledger().Complete(open())
	}
	if v := visits(now); v != 111 {
		t.Fatalf("second sweep visited %d slots, want 111 (the window from the open decision)", v)
	}
	s.Ledger().Complete(long)
	if v := visits(now); v != 0 {
		t.Fatalf("sweep after every decision closed visited %d slots, want 0", v)
	}
	// A decision past the TTL is still found and expired, then the
	// window moves past it.
	for range 5 {
		s.Ledger().Complete(open())
	}
	stale := open()
	if v := visits(now.Add(2 * time.Minute)); v != 6 {
		t.Fatalf("sweep with one stale decision visited %d slots, want 6 (the five closed since the last walk, then it)", v)
	}
	if s.dec.expired.Load() != 1 || e.State.Inflight.Load() != 0 {
		t.Fatalf("stale decision %x not expired: expired %d, in flight %d", stale, s.dec.expired.Load(), e.State.Inflight.Load())
	}
	if v := visits(now); v != 0 {
		t.Fatalf("sweep after the expiry visited %d slots, want 0", v)
	}
	// More than a ring opened since: the walk is bounded by the ring.
	open()
	for range 3 << 16 {
		s.Ledger().Complete(open())
	}
	if v := visits(now); v != 0 {
		t.Fatalf("sweep after the open decision was overwritten visited %d slots, want 0 (nothing open)", v)
	}
	for range 3<<16 + 1 {
		open()
	}
	if v := visits(now); v != 1<<16 {
		t.Fatalf("sweep of a full ring visited %d slots, want %d", v, 1<<16)
	}
}

// BenchmarkLedgerSweep is one sweep of the default ledger (65,536 slots):
// idle, and under load with 64 decisions open among the newest.
func BenchmarkLedgerSweep(b *testing.B) {
	s := mustServer(b, fmt.Sprintf(fourEndpoints, "least-request"))
	e := s.Snapshot().Deployments[0].Serve.Endpoints[0]
	for _, open := range []int{0, 64} {
		b.Run(fmt.Sprintf("open=%d", open), func(b *testing.B) {
			d := newDecisions(1<<16, 1)
			now := time.Now()
			for range 1 << 17 { // the ring has turned: every slot was used
				id := d.open(e, now.UnixNano(), &decisionMeta{model: -1})
				d.close(id)
			}
			for range open {
				d.open(e, now.UnixNano(), &decisionMeta{model: -1})
			}
			b.ResetTimer()
			for range b.N {
				d.sweep(now, time.Minute, true)
			}
		})
	}
}
