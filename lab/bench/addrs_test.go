package bench

import (
	"net"
	"strconv"
	"testing"
)

// The feedback port is taken on UDP and, with the ring, on TCP: both must
// bind at the port picked.
func TestFreeFeedbackPortBindsBoth(t *testing.T) {
	for range 5 {
		p, err := freeFeedbackPort()
		if err != nil {
			t.Fatal(err)
		}
		if p <= 0 || p > 65535 {
			t.Fatalf("port %d", p)
		}
		addr := "127.0.0.1:" + strconv.Itoa(p)
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("udp %s: %v", addr, err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			_ = pc.Close()
			t.Fatalf("tcp %s: %v", addr, err)
		}
		_ = pc.Close()
		_ = ln.Close()
	}
}
