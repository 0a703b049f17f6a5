package feedback

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
)

// Issue 28 item 6: decisions whose completions a feedback outage lost are
// closed when completions arrive again, not at decision_ttl: in-flight is
// right at the first tick after the gap. An endpoint whose engine reports
// running requests keeps that many open (the newest), and its Load does not
// move.
func TestFeedbackGapReconciled(t *testing.T) {
	cfg := mustConfig(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", "")+"\n")
	cfg.Feedback.StalledAfter = config.Duration(30 * time.Second)
	cfg.Feedback.StalledMinDecisions = 10
	s, err := newServer(t, cfg, route.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	s.checkFeedback(cfg, t0)
	ids := openIDs(t, s, 2)
	s.Line([]byte("turnout-done id=" + ids[0] + " srv=a status=200 ms=1"))
	s.checkFeedback(cfg, t0.Add(time.Second))
	// The outage: 200 decisions, no completion.
	openIDs(t, s, 200)
	s.checkFeedback(cfg, t0.Add(40*time.Second))
	if !s.Stalled() {
		t.Fatal("feedback not noticed stalled")
	}
	a := endpointByName(s, "a")
	// a's engine was scraped during the outage: 3 running, at the mark of
	// its in-flight count then.
	a.SetEngineLoad(&fleet.EngineLoad{Requests: 3, KVUsage: -1, Mark: a.Inflight()})
	loadA := a.Load()
	before := totalInflight(s)
	if before < 200 {
		t.Fatalf("in flight %d before the gap closes, want >= 200", before)
	}
	// Completions come back (one new decision completed).
	last := openIDs(t, s, 1)
	s.Line([]byte("turnout-done id=" + last[0] + " srv=a status=200 ms=1"))
	s.checkFeedback(cfg, t0.Add(41*time.Second))
	if s.Stalled() {
		t.Fatal("still stalled after a completion")
	}
	if got := a.Inflight(); got != 3 {
		t.Errorf("a: %d in flight after the gap, want its engine's 3", got)
	}
	if got := endpointByName(s, "b").Inflight(); got != 0 {
		t.Errorf("b (no engine figure): %d in flight after the gap, want 0", got)
	}
	if got := a.Load(); got != loadA {
		t.Errorf("a's Load moved from %d to %d", loadA, got)
	}
	if m := metricsText(s); !strings.Contains(m, fmt.Sprintf(`turnout_completions_total{result="reconciled"} %d`, before-3)) {
		t.Errorf("reconciled count (want %d):\n%s", before-3, m)
	}
}
