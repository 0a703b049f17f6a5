package kv

import (
	"net"
	"testing"
	"time"
)

// TestSubscriberSilentPeer: a peer that accepts the connection but never
// speaks ZMTP fails the handshake within the dial timeout and counts as a
// dial failure; the subscriber keeps retrying and Run returns on cancel.
func TestSubscriberSilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	r := startSubscriber(t, SubscriberConfig{Address: "tcp://" + ln.Addr().String(), DialTimeout: 100 * time.Millisecond})
	eventually(t, "two failed handshakes", func() bool { return r.subscriber.Stats().DialFailures >= 2 })
	if st := r.subscriber.Stats(); st.Connected || st.Messages != 0 {
		t.Fatalf("silent peer: %+v", st)
	}
}

// TestZMQNetwork: tcp:// and ipc:// endpoints map to net.Dial's networks;
// anything else is refused.
func TestZMQNetwork(t *testing.T) {
	for addr, want := range map[string][2]string{
		"tcp://10.0.0.5:5557":   {"tcp", "10.0.0.5:5557"},
		"ipc:///run/vllm/kv.ip": {"unix", "/run/vllm/kv.ip"},
	} {
		n, a, err := zmqNetwork(addr)
		if err != nil || n != want[0] || a != want[1] {
			t.Errorf("%s: %s %s %v, want %v", addr, n, a, err, want)
		}
	}
	for _, addr := range []string{"inproc://x", "10.0.0.5:5557", ""} {
		if _, _, err := zmqNetwork(addr); err == nil {
			t.Errorf("%q accepted", addr)
		}
	}
}
