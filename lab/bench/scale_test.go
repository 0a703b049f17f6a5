package bench

import (
	"context"
	"fmt"
	"testing"
)

// Every policy decides in every cell without allocating (amortized), the prefix index
// fills to the size asked for, and its heap per block is measured.
func TestScaleCells(t *testing.T) {
	o := DefaultScaleOptions()
	o.Endpoints = []int{16, 64}
	o.PromptKiB = []int{2}
	o.Blocks = []int{0, 20000}
	o.Decisions = 300
	rows, err := RunScale(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, p := range o.Policies {
		if hashesPrompts(p) {
			want += 2 * 2
		} else {
			want += 2
		}
	}
	if len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	for _, r := range rows {
		if r.Err != "" {
			t.Errorf("%s at %d endpoints: %s", r.Policy, r.Endpoints, r.Err)
		}
		// Process-wide counts: a GC empties sync.Pools (the per-request
		// Txn), refilled once each; route's own tests hold 0 exactly.
		if r.AllocsPerDecision > 0.1 {
			t.Errorf("%s at %d endpoints: %.2f allocations per decision", r.Policy, r.Endpoints, r.AllocsPerDecision)
		}
		if r.PerCore <= 0 || r.P99Us < r.P50Us {
			t.Errorf("%s: rate %.0f, p50 %.1f µs, p99 %.1f µs", r.Policy, r.PerCore, r.P50Us, r.P99Us)
		}
		if hashesPrompts(r.Policy) && r.Blocks > 0 && (r.Blocks < 20000 || r.BytesPerBlock <= 0) {
			t.Errorf("%s: filled %d blocks (%.0f B each), want >= 20000", r.Policy, r.Blocks, r.BytesPerBlock)
		}
	}
}

// BenchmarkScaleCell is bench scale's cell at 8 KiB prompts (the
// decision as RunScale times it, on its synthetic clock), for every
// policy of the grid, for instruction counts that do not depend on the
// machine's load: scripts/icount.sh with COLLECT='*route.(*Decider).Decide'
// (the set-up cancels out between its two iteration counts).
func BenchmarkScaleCell(b *testing.B) {
	for _, pol := range DefaultScaleOptions().Policies {
		for _, n := range []int{64, 1024} {
			b.Run(fmt.Sprintf("%s/%d", pol, n), func(b *testing.B) {
				o := DefaultScaleOptions()
				o.Decisions = b.N
				r := scaleCell(o, pol, n, 8, 0)
				if r.Err != "" {
					b.Fatal(r.Err)
				}
				b.ReportMetric(r.PerCore, "decisions/s/core")
			})
		}
	}
}
