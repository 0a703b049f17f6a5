package flow

import (
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
)

func sloController(t *testing.T) *Controller {
	t.Helper()
	c := New(testConfig(1, func(f *config.FlowConfig) {
		f.Classes = []config.FlowClass{
			{Name: "critical", TTFTSLO: config.Duration(time.Second)},
			{Name: "standard"},
			{Name: "sheddable", Shed: true, TTFTSLO: config.Duration(500 * time.Millisecond)},
		}
	}), testPool(1))
	t.Cleanup(c.Close)
	return c
}

// The objective: a trusted header's whole, positive, bounded ms, else the
// class's ttft_slo (0: none).
func TestObjective(t *testing.T) {
	c := sloController(t)
	for _, tc := range []struct {
		class int
		hdr   string
		want  int32
	}{
		{0, "", 1000}, {1, "", 0}, {2, "", 500},
		{1, "250", 250}, {0, "2500", 2500},
		{2, "0", 500}, {2, "-5", 500}, {2, "1.5", 500}, {2, "12ms", 500}, {2, "9999999999", 500}, {2, "600001", 500},
		{1, "600000", 600000},
	} {
		var hdr []byte
		if tc.hdr != "" {
			hdr = []byte(tc.hdr)
		}
		if got := c.objective(tc.class, hdr); got != tc.want {
			t.Errorf("class %d header %q: %d ms, want %d", tc.class, tc.hdr, got, tc.want)
		}
	}
	r := Request{SLOMs: 1000}
	if got := r.ObjectiveLeft(300 * time.Millisecond); got != 700 {
		t.Errorf("left after 300 ms held: %v", got)
	}
	if got := r.ObjectiveLeft(2 * time.Second); got != 1 {
		t.Errorf("left after 2 s held: %v, want 1", got)
	}
	if got := (&Request{}).ObjectiveLeft(0); got != 0 {
		t.Errorf("left without objective: %v", got)
	}
}

// Only a shedding class's request with an objective and a prediction
// above what is left of it is shed; the counters and lines say so.
func TestShedForSLOAndCounts(t *testing.T) {
	c := sloController(t)
	for _, tc := range []struct {
		r          Request
		left, pred float32
		want       bool
	}{
		{Request{Class: 2, SLOMs: 500}, 500, 600, true},
		{Request{Class: 2, SLOMs: 500}, 500, 400, false},
		{Request{Class: 2, SLOMs: 500}, 100, 400, true}, // held: less is left
		{Request{Class: 2, SLOMs: 500}, 500, 0, false},  // no prediction
		{Request{Class: 0, SLOMs: 1000}, 1000, 5000, false},
		{Request{Class: 1}, 0, 5000, false},
	} {
		if got := c.ShedForSLO(&tc.r, tc.left, tc.pred); got != tc.want {
			t.Errorf("%+v left %v predicted %v: shed %v, want %v", tc.r, tc.left, tc.pred, got, tc.want)
		}
	}
	c.Ticket(&Request{Class: 0, SLOMs: 1000}).Observe(999)
	c.Ticket(&Request{Class: 0, SLOMs: 1000}).Observe(1001)
	c.Ticket(&Request{Class: 0, SLOMs: 1000}).Observe(-1)
	c.Ticket(&Request{Class: 1}).Observe(1) // no objective: no ticket
	var nilC *Controller
	nilC.Ticket(&Request{SLOMs: 5}).Observe(1)
	if m, x, s := c.SLOCount("critical", SLOMet), c.SLOCount("critical", SLOMissed), c.SLOCount("sheddable", SLOShed); m != 1 || x != 2 || s != 2 {
		t.Fatalf("met %d missed %d shed %d, want 1 2 2", m, x, s)
	}
	var b strings.Builder
	c.writeSLOReadiness(&b, "d")
	if want := "slo d: critical 33.3% met (1/3, 0 shed), sheddable 0.0% met (0/0, 2 shed)\n"; b.String() != want {
		t.Fatalf("readiness %q, want %q", b.String(), want)
	}
}
