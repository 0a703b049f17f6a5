package policy

import (
	"math"
	"testing"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
)

// With a TTFT objective, predicted-ttft keeps a hit predicted to meet it
// (where the margins alone would move it), else takes the endpoint
// predicted to meet it, else the one predicted fastest; the pick's
// prediction goes with the choice (flow control sheds on it). The prior
// is the model: 20 ms + 20 ms per request of load + 10 ms per uncached
// KiB (22 blocks of 64 B: 13.75 ms on a miss, 0.625 ms on e2, which
// holds 21 of them).
func TestPredictedTTFTObjective(t *testing.T) {
	sys := string(make([]byte, 64*20))
	for _, tc := range []struct {
		name      string
		objective float32
		loads     []int64
		want      string
		predMs    float64
	}{
		// Without an objective the 50 ms margin moves the hit (100.6 ms) to e0 (33.75 ms).
		{"no objective: the margins move the hit", 0, []int64{0, 0, 4, 0}, "e0", 33.75},
		{"the hit meets 200 ms: it stays", 200, []int64{0, 0, 4, 0}, "e2", 100.625},
		{"the hit misses 50 ms: an endpoint that meets it", 50, []int64{1, 0, 4, 0}, "e1", 33.75},
		{"nothing meets 10 ms: the fastest", 10, []int64{1, 2, 4, 0}, "e3", 33.75},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultPredictedTTFTConfig()
			cfg.BlockBytes, cfg.SessionAffinity = 64, false
			cfg.PerRequestMs, cfg.MarginMs = 20, 50
			var pt *PredictedTTFT
			p := routetest.Pool(t, 4, func(p *fleet.Pool) fleet.Policy { pt = NewPredictedTTFT(cfg, p, fleet.NewRand(5)); return pt })
			pt.idx.lrus[2].insert(blocksOf(sys, 1))
			for i, l := range tc.loads {
				p.Endpoints[i].AddInflight(l)
			}
			blocks := blocksOf(sys, 2)
			c := routetest.Choose(p, &fleet.Request{Blocks: blocks, PromptBytes: len(blocks) * 64, TTFTObjectiveMs: tc.objective}, 3)
			if got := c.Endpoints[0].Name; got != tc.want {
				t.Fatalf("pick %s; want %s first", routetest.Names(c.Endpoints), tc.want)
			}
			if got := float64(c.Predicted.TTFTMs); math.Abs(got-tc.predMs) > 0.01 {
				t.Fatalf("predicted %.3f ms, want %.3f", got, tc.predMs)
			}
			if len(c.Endpoints) != 3 || c.Endpoints[1] == c.Endpoints[0] || c.Endpoints[2] == c.Endpoints[0] || c.Endpoints[1] == c.Endpoints[2] {
				t.Fatalf("fallbacks %s: want 3 distinct", routetest.Names(c.Endpoints))
			}
		})
	}
}
