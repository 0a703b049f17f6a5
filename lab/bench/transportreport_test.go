package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The paced columns carry turnout's own decision time where it was read
// ("-" for the trivial row), and the stall probe gets its own table, one
// line per row and CPU, only when there are probes.
func TestWriteTransportTableServerTimeAndStalls(t *testing.T) {
	rows := []TransportRow{
		{Target: TransportTrivial, Requests: 10, PacedRPS: 5, Stalls: []StallProbe{{CPU: 1, Duration: 2 * time.Second, Lost100: 0.0123, N100: 40, Max: 2500 * time.Microsecond}}},
		{Target: TransportRoute, Requests: 10, PacedRPS: 5, ServerP50: 17.5, ServerP99: 96.25, ServerOver100: 0.0041, ServerTimed: 2171},
	}
	var b bytes.Buffer
	if err := WriteTransportTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(out, "\n")
	for _, want := range []string{"17.5", "96.2", "0.41%", "2171"} {
		if !strings.Contains(lines[2], want) {
			t.Errorf("route line %q lacks %s", lines[2], want)
		}
	}
	if f := strings.Fields(lines[1]); strings.Join(f[len(f)-4:], " ") != "- - - -" {
		t.Errorf("trivial line %q: want no server figures", lines[1])
	}
	_, stalls, ok := strings.Cut(out, "VM stall probe")
	if !ok {
		t.Fatalf("no stall table in\n%s", out)
	}
	// 40 stretches over 100 µs in 2 s: 20 a second; 1.23 % of the time.
	if !strings.Contains(stalls, "1.23%") || !strings.Contains(stalls, " 20 ") || !strings.Contains(stalls, "2.500") {
		t.Errorf("stall table lacks the probe's figures:\n%s", stalls)
	}
	b.Reset()
	rows[0].Stalls = nil
	if err := WriteTransportTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "VM stall probe") {
		t.Error("a stall table without probes")
	}
}
