package policy

import (
	"testing"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
)

// Two replicas hold a conversation's whole hashed prompt (a turn moved
// once): the next turn goes to the one that got it last, here or from a
// peer, even one request above the other's load, and back to the lower
// load when nothing is known of the prompt.
func TestPrefixAffinityTieGoesToLastSent(t *testing.T) {
	cfg := DefaultPrefixAffinityConfig()
	cfg.BlockBytes = 64
	conv := blocksOf(string(make([]byte, 64*20)), 0)
	for _, tc := range []struct {
		name string
		last int // endpoint that got the prompt last; -1: nobody recorded
		peer bool
		want string
	}{
		{"last here, above the other's load", 2, false, "e2"},
		{"last by a peer", 2, true, "e2"},
		{"last the less loaded one", 1, false, "e1"},
		{"unknown: lower load", -1, false, "e1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pa *PrefixAffinity
			p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { pa = NewPrefixAffinity(cfg, p, fleet.NewRand(3)); return pa })
			// Both hold the whole prompt; the LRUs alone cannot tell the order.
			pa.lrus[1].insert(conv)
			pa.lrus[2].insert(conv)
			switch {
			case tc.last >= 0 && tc.peer:
				pa.RecordPrefix(tc.last, conv)
			case tc.last >= 0:
				pa.idx.sent(tc.last, conv)
			}
			loads := []int64{3, 2, 3, 3}
			for i, l := range loads {
				p.Endpoints[i].AddInflight(l)
			}
			c := routetest.Choose(p, &fleet.Request{Blocks: conv}, 1)
			if got := c.Endpoints[0].Name; got != tc.want || c.Outcome != fleet.OutcomeAffinity || c.Matched != len(conv) {
				t.Fatalf("pick %s outcome %v matched %d; want %s affinity %d", got, c.Outcome, c.Matched, tc.want, len(conv))
			}
			// The pick is now the prompt's last replica: the next turn follows it.
			if got := routetest.Choose(p, &fleet.Request{Blocks: conv}, 1).Endpoints[0].Name; got != tc.want {
				t.Fatalf("next turn went to %s, want %s", got, tc.want)
			}
		})
	}
}

// The table keeps one endpoint per prompt, tells other prompts apart by
// their upper bits, and skips endpoint indexes it cannot hold.
func TestLastSentTable(t *testing.T) {
	tb := newLastSent(4, 1024)
	if len(tb.slots) != lastMinSlots {
		t.Fatalf("%d slots, want the minimum %d", len(tb.slots), lastMinSlots)
	}
	const k = 0xdeadbeef12345678
	if got := tb.get(k); got != -1 {
		t.Fatalf("empty table answered %d", got)
	}
	tb.put(k, 3)
	tb.put(k, 1)
	if got := tb.get(k); got != 1 {
		t.Fatalf("got %d, want the last put 1", got)
	}
	if got := tb.get(k ^ 1<<40); got != -1 { // same slot, another prompt
		t.Fatalf("another prompt in the slot answered %d", got)
	}
	tb.put(k^1<<40, 2) // a collision overwrites
	if tb.get(k) != -1 || tb.get(k^1<<40) != 2 {
		t.Fatalf("collision: %d %d", tb.get(k), tb.get(k^1<<40))
	}
	tb.put(k, 1<<lastIndexBits)
	if got := tb.get(k); got != -1 {
		t.Fatalf("an index beyond the table's bits was kept: %d", got)
	}
	if n := len(newLastSent(64, 1<<24).slots); n != lastMaxSlots {
		t.Fatalf("%d slots, want the maximum %d", n, lastMaxSlots)
	}
}
