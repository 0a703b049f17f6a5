package fleet

import (
	"testing"
	"time"
)

// A client that gives up before the replica's response headers (nginx's
// 499 with no $upstream_header_time, HAProxy's %Tr -1) is no answer in
// time however short its total: it must not clear stall suspicion, and a
// few in a row raise it. An answer with headers resets the count.
func TestStallUnansweredFeedback(t *testing.T) {
	var st State
	st.Stall.BudgetNs.Store(int64(30 * time.Second))
	now := time.Now().UnixNano()
	for i := range UnansweredSuspect {
		if st.Stall.Suspect.Load() {
			t.Fatalf("suspect after %d unanswered completions", i)
		}
		st.Observe(499, 3000, -1, now, true)
		if st.Stall.FastStart.Load() != 0 {
			t.Fatalf("a client abort before any answer counted as answered in time")
		}
	}
	if !st.Stall.Suspect.Load() {
		t.Fatalf("%d unanswered completions in a row did not make the endpoint suspect", UnansweredSuspect)
	}
	st.Stall.Suspect.Store(false)
	st.Observe(200, 900, 40, now, true)
	if st.Stall.FastStart.Load() == 0 || st.Stall.Unanswered.Load() != 0 {
		t.Fatalf("an answer with headers: fast start %d, unanswered %d", st.Stall.FastStart.Load(), st.Stall.Unanswered.Load())
	}
	// Unverified lines (anyone on a feedback source) count for nothing.
	for range 2 * UnansweredSuspect {
		st.Observe(499, 100, -1, now, false)
	}
	if st.Stall.Suspect.Load() {
		t.Fatal("unverified lines raised suspicion")
	}
}
