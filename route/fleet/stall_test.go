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

// An endpoint's limit is scale x the p99 of its recent first-token times
// (tft=, else ttfb=), capped by the budget; times older than two windows
// stop counting.
func TestStallLimitScaledToFirstTokens(t *testing.T) {
	var st State
	st.Stall.BudgetNs.Store(int64(30 * time.Second))
	t0 := time.Now()
	if c, n := st.RecentFirstToken(t0); n != 0 {
		t.Fatalf("no feedback yet: %d samples %v", n, c)
	}
	// Only ttfb= known (a proxy without first_token_timing).
	for range StallMinSamples {
		st.Observe(200, 900, 300, t0.UnixNano(), true)
	}
	c, n := st.RecentFirstToken(t0)
	if p99, ok := P99(&c, n); !ok || p99 != 497500*time.Microsecond {
		t.Fatalf("ttfb 300 ms x %d: p99 %v %v, want 497.5ms (0.99 of the way through the 250-500ms bucket)", n, p99, ok)
	}
	// tft= takes over once it arrives.
	for range 100 {
		st.ObserveFirstToken(40)
	}
	c, n = st.RecentFirstToken(t0)
	if p99, ok := P99(&c, n); n != 100 || !ok || p99 != 49750*time.Microsecond {
		t.Fatalf("tft 40 ms x 100: %d samples, p99 %v %v, want 49.75ms", n, p99, ok)
	}
	// Two slow ones in 102 are past the 99th percentile's rank (100.98).
	st.ObserveFirstToken(4000)
	st.ObserveFirstToken(4000)
	c, n = st.RecentFirstToken(t0)
	if p99, _ := P99(&c, n); p99 < 2500*time.Millisecond || p99 > 5*time.Second {
		t.Fatalf("2 of 102 at 4 s: p99 %v, want in the 2.5-5s bucket", p99)
	}
	// Past the last bound: unknown, the budget applies.
	for range 10 {
		st.ObserveFirstToken(700_000)
	}
	c, n = st.RecentFirstToken(t0)
	if p99, ok := P99(&c, n); ok {
		t.Fatalf("p99 past the last bucket read as %v", p99)
	}
	// Two windows later, with nothing new, nothing counts.
	st.RecentFirstToken(t0.Add(StallWindow))
	if _, n := st.RecentFirstToken(t0.Add(2 * StallWindow)); n != 0 {
		t.Fatalf("%d samples counted two windows later", n)
	}
	for _, tc := range []struct{ scaled, budget, want time.Duration }{
		{time.Second, 30 * time.Second, time.Second},
		{time.Minute, 30 * time.Second, 30 * time.Second},
		{0, 30 * time.Second, 30 * time.Second},
		{time.Second, 0, 0},
	} {
		st.Stall.BudgetNs.Store(int64(tc.budget))
		st.Stall.SetScaled(tc.scaled)
		if got := time.Duration(st.Stall.Limit()); got != tc.want {
			t.Errorf("scaled %v budget %v: limit %v, want %v", tc.scaled, tc.budget, got, tc.want)
		}
	}
}
