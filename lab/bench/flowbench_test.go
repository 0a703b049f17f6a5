package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestCompressForOffersTheLoad(t *testing.T) {
	// 100 requests over 99 s (about 1/s), each 1 s of service at full
	// scale: 2 replicas x 4 running serve 8/s, so 1.5x is 12/s: compress 12.
	var reqs []Request
	for i := range 100 {
		reqs = append(reqs, Request{Index: i, Arrival: time.Duration(i) * time.Second, InputTokens: 0, OutputTokens: 10})
	}
	s := SimOptions{Replicas: 2, MaxRunning: 4}
	s.Timing.InterTokenLatency = 100 * time.Millisecond
	if got := MeanService(reqs, s); got != time.Second {
		t.Fatalf("mean service %v, want 1s", got)
	}
	if got := CompressFor(reqs, s, 1.5); math.Abs(got-12*99.0/100) > 1e-9 {
		t.Fatalf("compress %v, want %v", got, 12*99.0/100)
	}
}

func TestAssignClasses(t *testing.T) {
	reqs := make([]Request, 10000)
	for i := range reqs {
		reqs[i] = Request{Index: i, Session: "s" + string(rune('a'+i%7))}
	}
	AssignClasses(reqs, 0.1, 4)
	crit := 0
	tenants := map[string]bool{}
	bySession := map[string]string{}
	for _, r := range reqs {
		if r.Class == ClassCritical {
			crit++
		} else if r.Class != ClassStandard {
			t.Fatalf("class %q", r.Class)
		}
		tenants[r.Tenant] = true
		if prev, ok := bySession[r.Session]; ok && prev != r.Tenant {
			t.Fatalf("session %s in two tenants", r.Session)
		}
		bySession[r.Session] = r.Tenant
	}
	if crit < 900 || crit > 1100 {
		t.Fatalf("%d critical of 10000, want about 1000", crit)
	}
	if len(tenants) < 2 || len(tenants) > 4 {
		t.Fatalf("%d tenants, want 2..4", len(tenants))
	}
}

func TestWriteFlowMarkdown(t *testing.T) {
	var b strings.Builder
	rows := []FlowRow{{Setup: "x", Load: 1.5, Critical: Summarize([]float64{1, 2, 3}), Standard: Summarize([]float64{10}), Throughput: 2.5, Errors: 1}}
	if err := WriteFlowMarkdown(&b, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| 1.5x | x | 2 / 3 / 3 (3) | 10 / 10 / 10 (1) | 2.50 | 1 |") {
		t.Fatalf("table:\n%s", b.String())
	}
}
