package cluster

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnout/turnout/lab/testenv/natstest"
	"github.com/turnout/turnout/route/fleet"
)

// Messages the NATS client drops for a slow consumer (this instance's
// handler behind by more than the pending limit) are counted, not lost
// silently: the receiver's figures handler is held while a burst arrives
// over a pending limit of one message.
func TestSlowConsumerDropsCounted(t *testing.T) {
	ns := natstest.Start(t, 0)
	recv := startNode(t, ns.URL, "node-r")
	eventually(t, "connected", recv.sync.Connected)
	if m := metric(recv, "turnout_cluster_slow_consumer_dropped_total"); m != "0" {
		t.Fatalf("dropped %q before any message, want 0", m)
	}
	recv.sync.subMu.Lock()
	if err := recv.sync.engSub.SetPendingLimits(1, -1); err != nil {
		t.Fatal(err)
	}
	recv.sync.subMu.Unlock()
	held, release := make(chan struct{}, 1), make(chan struct{})
	recv.sync.OnFigures(func([]byte, *fleet.EngineLoad, time.Duration) {
		select {
		case held <- struct{}{}:
			<-release
		default:
		}
	})
	defer close(release)
	sender := startNode(t, ns.URL, "node-s")
	eventually(t, "sender connected", sender.sync.Connected)
	sender.sync.Publish("a", &fleet.EngineLoad{Requests: 1}, time.Second)
	sender.sync.Flush()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first figures never reached the receiver's handler")
	}
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := range 50 {
		if err := nc.Publish(recv.sync.cfg.Subject+engineSubject, []byte("burst "+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the burst's drops counted", func() bool {
		n, _ := strconv.Atoi(metric(recv, "turnout_cluster_slow_consumer_dropped_total"))
		return n >= 40
	})
}
