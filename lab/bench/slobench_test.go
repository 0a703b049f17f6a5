package bench

import (
	"strings"
	"testing"
	"time"
)

// The SLO replay: only the setup with flow control's objective sheds, and
// only sheddable requests; every request is counted once per row.
func TestRunSLOShedsOnlySheddableWithObjective(t *testing.T) {
	reqs := SyntheticTrace(300, 7)
	o := DefaultSimOptions()
	o.MaxRunning, o.Compress = 2, 4 // queues build: predictions pass 100 ms
	so := SLOOptions{Sim: o, CriticalShare: 0.3, Objective: 100 * time.Millisecond, SheddableObjective: 100 * time.Millisecond, Seeds: []uint64{1}}
	rows, err := RunSLO(reqs, SLOSetups(so.Objective, so.SheddableObjective, 1), so)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	for _, r := range rows {
		if r.Critical.N+r.Sheddable.N != len(reqs) || r.Critical.N == 0 {
			t.Fatalf("%s: %d critical + %d sheddable of %d requests", r.Setup, r.Critical.N, r.Sheddable.N, len(reqs))
		}
		if r.Critical.Shed != 0 {
			t.Fatalf("%s shed %d critical requests", r.Setup, r.Critical.Shed)
		}
		withSLO := strings.Contains(r.Setup, "SLO")
		if withSLO != (r.Sheddable.Shed > 0) {
			t.Fatalf("%s shed %d sheddable requests", r.Setup, r.Sheddable.Shed)
		}
	}
	var b strings.Builder
	if err := WriteSLOMarkdown(&b, rows); err != nil || !strings.Contains(b.String(), "predicted-ttft + SLO") {
		t.Fatalf("markdown %v:\n%s", err, b.String())
	}
}
