package spoe

import (
	"testing"
	"time"
)

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

// A message read past timeout processing after HAProxy sent it opens no
// decision; one on time is decided.
func TestLateMessageNotDecided(t *testing.T) {
	a := mustAgent(t, oneDeployment)
	d := a.decider()
	ask := func(sent int64) map[string]string {
		args := append(routeArgs("POST", "/v1/chat/completions", chatBody("solo", "hi")), sentArg(sent))
		out, err := ack(d, header{StreamID: 1, FrameID: 1}, messagesPayload(MessageRoute, args), nil, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := readHeader(out[4:])
		return vars(t, p)
	}
	now := time.Now().UnixMilli()
	if v := ask(now); v[VarServer] == "" || v[VarDecision] == "" {
		t.Fatalf("a message on time was not routed: %v", v)
	}
	if v := ask(now - 5000); len(v) != 0 {
		t.Fatalf("a message sent 5 s ago was answered: %v", v)
	}
	var open int64
	for _, e := range a.srv.Snapshot().Deployments[0].Serve.Endpoints {
		open += e.State.Inflight.Load()
	}
	if open != 1 {
		t.Fatalf("%d decisions open, want the one on time", open)
	}
}
