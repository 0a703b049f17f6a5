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
