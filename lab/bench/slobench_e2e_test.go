//go:build e2e

package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The SLO replay through real processes (HAProxy, turnout, mock
// replicas): every request is counted once per row, nothing fails, only
// the setup whose flow control carries the objectives sheds, and only
// sheddable requests; at 1.5x the replicas' capacity shedding keeps the
// critical class's attainment high, at or above the same policy's
// without it.
func TestSLOE2E(t *testing.T) {
	turnout, lab := e2eBinaries(t)
	reqs := SyntheticTrace(160, 5)
	o := DefaultSimOptions()
	o.Replicas, o.MaxRunning, o.Concurrency = 2, 8, 256
	o.Compress = CompressFor(reqs, o, 1.5) // the sim: round robin 69 %, predicted-ttft 74 %, with the objectives 100 %
	so := SLOOptions{Sim: o, CriticalShare: 0.25, Objective: time.Second, SheddableObjective: 300 * time.Millisecond, Seeds: []uint64{1}}
	log := zerolog.Nop()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	rows, err := RunSLOE2E(ctx, reqs, so, E2EOptions{
		Sim: o, TimeScale: 0.2, ProxySetup: ProxySetup{Proxy: ProxyHAProxy, HAProxy: "haproxy", Turnout: turnout, Lab: lab},
		WorkDir: t.TempDir(), Timeout: 4 * time.Minute, Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	var plain, withSLO float64
	for _, r := range rows {
		t.Logf("%s: critical %d/%d met, sheddable %d/%d met, %d shed, %d errors", r.Setup, r.Critical.Met, r.Critical.N, r.Sheddable.Met, r.Sheddable.N, r.Sheddable.Shed, r.Errors)
		if r.Critical.N+r.Sheddable.N != len(reqs) || r.Critical.N == 0 || r.Errors != 0 {
			t.Fatalf("%s: %d critical + %d sheddable of %d requests, %d errors", r.Setup, r.Critical.N, r.Sheddable.N, len(reqs), r.Errors)
		}
		if r.Critical.Shed != 0 {
			t.Fatalf("%s shed %d critical requests", r.Setup, r.Critical.Shed)
		}
		isSLO := strings.Contains(r.Setup, "SLO")
		if isSLO != (r.Sheddable.Shed > 0) {
			t.Fatalf("%s shed %d sheddable requests", r.Setup, r.Sheddable.Shed)
		}
		switch {
		case isSLO:
			withSLO = r.Critical.Attainment()
		case strings.HasPrefix(r.Setup, "predicted-ttft"):
			plain = r.Critical.Attainment()
		}
	}
	if withSLO < 0.8 || withSLO < plain {
		t.Fatalf("critical attainment with the objectives %.2f, want >= 0.8 and >= predicted-ttft's without (%.2f)", withSLO, plain)
	}
}
