package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
)

// gone is a Watch whose caller left (or not), counting the questions.
type gone struct {
	left  bool
	asked int
}

func (g *gone) Gone() bool { g.asked++; return g.left }

// Item 5 of issue 42: a decision whose caller is gone is closed at once,
// but only while the process may just have been paused: otherwise the
// Watch (a syscall) is not asked at all.
func TestDropAbandoned(t *testing.T) {
	for _, tc := range []struct {
		name              string
		beatAgo           time.Duration // 0: no heartbeat running
		left              bool
		wantAsked, wantOn bool // Watch asked; decision still open
	}{
		{"heartbeat on time, caller gone", 10 * time.Millisecond, true, false, true},
		{"no heartbeat (not running)", 0, true, false, true},
		{"heartbeat overdue, caller gone", time.Second, true, true, false},
		{"heartbeat overdue, caller there", time.Second, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
			if tc.beatAgo > 0 {
				s.dec.pause.beat.Store(time.Now().Add(-tc.beatAgo).UnixNano())
			}
			w := &gone{left: tc.left}
			var in contract.Input
			in.Body = []byte(`{"model":"llama","prompt":"hi"}`)
			in.Watch = w
			var v contract.Verdict
			if s.Decide(&in, &v); !v.Routed() {
				t.Fatalf("status %d %s", v.Status, v.Body)
			}
			if asked := w.asked > 0; asked != tc.wantAsked {
				t.Errorf("Watch asked %d times, want asked %v", w.asked, tc.wantAsked)
			}
			var open int64
			for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
				open += e.State.Inflight.Load()
			}
			if (open == 1) != tc.wantOn {
				t.Errorf("%d decisions open, want open %v", open, tc.wantOn)
			}
			if got := s.dec.abandoned.Load(); (got == 1) == tc.wantOn {
				t.Errorf("abandoned %d", got)
			}
			// A closed decision's late feedback finds nothing to close.
			if closed := s.Ledger().Complete(v.Decision); closed != tc.wantOn {
				t.Errorf("feedback closed it: %v, want %v", closed, tc.wantOn)
			}
		})
	}
}

// The pause is suspected for pauseGrace after a late heartbeat, then not.
func TestPauseWatchGrace(t *testing.T) {
	var p pauseWatch
	now := time.Now().UnixNano()
	p.beat.Store(now)
	if p.suspect(now) {
		t.Fatal("suspected right after a heartbeat")
	}
	p.until.Store(now + int64(pauseGrace))
	if !p.suspect(now + int64(pauseGrace)/2) {
		t.Fatal("not suspected within the grace after a pause")
	}
	p.beat.Store(now + int64(pauseGrace))
	if p.suspect(now + int64(pauseGrace) + 1) {
		t.Fatal("still suspected after the grace")
	}
}
