package feedback

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// Issue 42 item 1: with the default 30 s budget, a replica whose peers
// answer their first token in ~20 ms gets a limit of the 1 s floor (3 x
// p99 = 75 ms), borrowed from its pool while it has no times of its own,
// and a stall with no feedback at all (clients that wait) degrades it
// within a few seconds: by the budget alone the sweep would wait 15 s
// and the probe 30 s more.
func TestStallLimitScaledDegradesFast(t *testing.T) {
	r0, r1, r2 := newReplica(t), newReplica(t), newReplica(t)
	var b strings.Builder
	b.WriteString("health: {disable: true}\nfeedback: {syslog: 127.0.0.1:5140}\ndeployments:\n  - name: llama\n    policy: {name: least-request}\n    pools:\n      - role: mixed\n        endpoints:\n")
	for i, r := range []*replica{r0, r1, r2} {
		fmt.Fprintf(&b, "          - {name: r%d, address: %q}\n", i, strings.TrimPrefix(r.URL, "http://"))
	}
	l := zerolog.Nop()
	s, err := newServer(t, mustConfig(t, b.String()), route.Options{Log: &l})
	if err != nil {
		t.Fatal(err)
	}
	endpointByName(s, "r2").SetDown(true) // no first-token times of its own
	limit := func(name string) string {
		return fmt.Sprintf(`turnout_endpoint_stall_limit_seconds{deployment="llama",pool="llama_mixed",endpoint="%s"}`, name)
	}
	s.Ticker().Sweep(t.Context(), time.Now())
	wantMetric(t, metricsText(s), limit("r0")+" 30")
	for range 60 {
		ctx := do(s, chatBody("llama", "", "x"))
		s.Line([]byte(fmt.Sprintf("turnout-done id=%s srv=%s status=200 ms=900 ttfb=5 tft=20", hdr(ctx, contract.HdrDecision), hdr(ctx, contract.HdrServer))))
	}
	s.Ticker().Sweep(t.Context(), time.Now())
	text := metricsText(s)
	for _, name := range []string{"r0", "r1", "r2"} {
		wantMetric(t, text, limit(name)+" 1")
	}

	r0.stall.Store(int64(time.Minute))
	var onR0 bool
	for i := 0; i < 40 && !onR0; i++ {
		ctx := do(s, chatBody("llama", "", "x"))
		if onR0 = hdr(ctx, contract.HdrServer) == "r0"; !onR0 {
			s.Line([]byte("turnout-done id=" + hdr(ctx, contract.HdrDecision) + " srv=r1 status=200 ms=900 ttfb=5 tft=20"))
		}
	}
	if !onR0 {
		t.Fatal("no decision for r0")
	}
	start := time.Now()
	tickUntil(t, s, "r0 degraded", func() bool { return endpointByName(s, "r0").Degraded() })
	t.Logf("degraded %v after its decision opened (limit 1s, budget 30s)", time.Since(start).Round(10*time.Millisecond))
	if endpointByName(s, "r1").Degraded() {
		t.Fatal("healthy r1 degraded")
	}
}
