package hints

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
)

const conf = `health: {disable: true}
feedback: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: prefix-affinity, params: {block_bytes: %d}}
    pools:
      - endpoints:
          - {name: a, address: "127.0.0.1:1"}
          - {name: b, address: "127.0.0.1:2"}
`

// A prefix pool whose prompts are shorter than one block is named in the
// log once, with the block size and the fix; prompts of several blocks, or
// too little traffic, say nothing.
func TestPrefixShortPrompts(t *testing.T) {
	system := strings.Repeat("You are a helpful assistant. ", 10) // ~290 bytes, as reported
	for _, tc := range []struct {
		name       string
		blockBytes int
		requests   int
		warn       bool
	}{
		{"prompts under one block", 1024, 40, true},
		{"prompts of several blocks", 64, 40, false},
		{"too few decisions to judge", 1024, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := route.New(routetest.MustConfig(t, fmt.Sprintf(conf, tc.blockBytes)), route.Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			log := zerolog.New(&logs)
			h := NewPrefix(&log)
			snap := d.Snapshot()
			t0 := time.Now()
			h.Tick(context.Background(), snap, t0)
			for i := range tc.requests {
				var in contract.Input
				in.Body = []byte(routetest.ChatBody("llama", system, fmt.Sprintf("question %d", i)))
				var v contract.Verdict
				d.Decide(&in, &v)
				if !v.Routed() {
					t.Fatalf("status %d", v.Status)
				}
			}
			short := snap.Pools()[0].Metrics.ShortPrompts.Load()
			if tc.blockBytes > 600 && short != uint64(tc.requests) {
				t.Errorf("%d short prompts counted of %d", short, tc.requests)
			}
			if tc.blockBytes < 100 && short != 0 {
				t.Errorf("%d prompts of several blocks counted short", short)
			}
			h.Tick(context.Background(), snap, t0.Add(30*time.Second)) // window not over
			if logs.Len() != 0 {
				t.Fatalf("warned before a window of traffic: %s", logs.String())
			}
			h.Tick(context.Background(), snap, t0.Add(61*time.Second))
			got := strings.Contains(logs.String(), "shorter than one block")
			if got != tc.warn {
				t.Fatalf("warned %v, want %v: %s", got, tc.warn, logs.String())
			}
			if tc.warn {
				for _, w := range []string{`"pool":"llama`, `"block_bytes":1024`, "lower block_bytes"} {
					if !strings.Contains(logs.String(), w) {
						t.Errorf("hint lacks %q: %s", w, logs.String())
					}
				}
				// Said once while the traffic stays the same.
				for i := range tc.requests {
					var in contract.Input
					in.Body = []byte(routetest.ChatBody("llama", system, fmt.Sprintf("again %d", i)))
					var v contract.Verdict
					d.Decide(&in, &v)
				}
				h.Tick(context.Background(), snap, t0.Add(130*time.Second))
				if n := strings.Count(logs.String(), "shorter than one block"); n != 1 {
					t.Errorf("said %d times", n)
				}
			}
		})
	}
}
