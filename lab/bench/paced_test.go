package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestPacedLoopHoldsTheRate: paced, instant decisions go no faster than
// the rate asked (a closed loop would send thousands), and some are sent;
// the wait before a send is not in the latencies.
func TestPacedLoopHoldsTheRate(t *testing.T) {
	var sent atomic.Int64
	target := transportTarget{name: "instant", worker: func(int) (func(int) error, func(), error) {
		return func(int) error { sent.Add(1); return nil }, func() {}, nil
	}}
	const rate, conns, d = 20.0, 2, 500 * time.Millisecond
	res, err := pacedLoop(context.Background(), target, conns, rate, d)
	if err != nil {
		t.Fatal(err)
	}
	// The last send may start up to d after the start: rate*d + one per worker.
	if limit := int(rate*d.Seconds()) + conns; res.Requests > limit || res.Requests < 1 || int64(res.Requests) != sent.Load() {
		t.Fatalf("%d decisions answered (%d sent) in %s at %.0f/s: want 1..%d", res.Requests, sent.Load(), d, rate, limit)
	}
	// Counted, the wait would put every latency but the first near the
	// gap between a worker's sends (100 ms).
	slow := 0
	for _, l := range res.Latencies {
		if l >= 50*time.Millisecond {
			slow++
		}
	}
	if slow*2 > len(res.Latencies) {
		t.Fatalf("%d of %d instant decisions took 50 ms or more: the pacing wait is counted", slow, len(res.Latencies))
	}
	if _, err := pacedLoop(context.Background(), target, conns, 0, d); err == nil {
		t.Fatal("rate 0 accepted")
	}
}

// TestPacedLoopCountsLateSends: one worker whose decisions take three of
// its gaps sends ever later; from the intended send times its latencies
// grow past the decision's own time, and the lateness is reported.
func TestPacedLoopCountsLateSends(t *testing.T) {
	target := transportTarget{name: "slow", worker: func(int) (func(int) error, func(), error) {
		return func(int) error { time.Sleep(30 * time.Millisecond); return nil }, func() {}, nil
	}}
	res, err := pacedLoop(context.Background(), target, 1, 100, 400*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Latencies) < 4 || len(res.Late) != len(res.Latencies) {
		t.Fatalf("%d latencies, %d lateness samples", len(res.Latencies), len(res.Late))
	}
	last := res.Latencies[len(res.Latencies)-1]
	if last < 60*time.Millisecond || res.Late[len(res.Late)-1] < 30*time.Millisecond {
		t.Fatalf("last latency %s, lateness %s: a send behind its schedule is not counted from its intended time", last, res.Late[len(res.Late)-1])
	}
}
