package spoe

import "testing"

// A message read past timeout processing is late whatever the offset
// between HAProxy's clock and the agent's; a clock step is not a backlog.
func TestLateness(t *testing.T) {
	const budget = 500
	for _, offset := range []int64{0, 10_000, -10_000} { // agent clock minus HAProxy's
		var l lateness
		at := func(sent, lag int64) bool { return l.late(sent+offset+lag, sent, budget) }
		for sent := int64(1000); sent < 2000; sent += 10 {
			if at(sent, 1+sent%3) {
				t.Fatalf("offset %d: an answer on time is late", offset)
			}
		}
		// A stop: the backlog, read at once on resume, 0.6-2 s after it was sent.
		resume := int64(4000)
		for sent := int64(2000); sent < 3400; sent += 10 {
			if !l.late(resume+offset, sent, budget) {
				t.Fatalf("offset %d: message sent %d ms before it was read is not late", offset, resume-sent)
			}
		}
		if at(resume, 2) {
			t.Fatalf("offset %d: a fresh message after the backlog is late", offset)
		}
		if !l.past(resume+offset+budget+10, resume, budget) {
			t.Fatalf("offset %d: a decision finished past the budget is not past", offset)
		}
	}
	// HAProxy's clock steps back by 5 s: every message looks late until
	// the run outlasts the budget; then the lag starts again from there.
	var l lateness
	for sent := int64(1000); sent < 1100; sent += 10 {
		l.late(sent+1, sent, budget)
	}
	late := 0
	for now := int64(1100); now < 3000; now += 10 {
		if l.late(now, now-5000, budget) {
			late++
		}
	}
	if late == 0 || late > budget/10+2 {
		t.Fatalf("after a 5 s clock step, %d messages (10 ms apart) were late; want those within one budget", late)
	}
}
