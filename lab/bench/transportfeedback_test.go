package bench

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCloserKeepsOpen: with open 2, a decision's line goes out after two
// more decisions, in order, with the token; Close sends the last two.
func TestCloserKeepsOpen(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	c, err := newCloser(feedbackTo{addr: pc.LocalAddr().String(), token: "tok123", open: 2})
	if err != nil {
		t.Fatal(err)
	}
	read := func() string {
		t.Helper()
		buf := make([]byte, 512)
		_ = pc.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
	for i := range 5 {
		if err := c.done([]byte("id"+strconv.Itoa(i)), []byte("r1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		got := read()
		if !strings.Contains(got, "turnout-done id=id"+strconv.Itoa(i)+" srv=r1 ") || !strings.Contains(got, " tok=tok123") {
			t.Fatalf("line %d: %q", i, got)
		}
	}
	if err := (*closer)(nil).done(nil, nil); err != nil {
		t.Fatalf("a nil closer: %v", err)
	}
	if c, _ := newCloser(feedbackTo{addr: pc.LocalAddr().String(), open: -1}); c != nil {
		t.Fatal("open -1 must never close")
	}
}

// TestSPOEVar reads set-var values out of an ACK's action list.
func TestSPOEVar(t *testing.T) {
	setVar := func(dst []byte, name, val string) []byte {
		dst = append(dst, 1, 3, 2) // set-var, 3 args, scope txn
		dst = spopBytes(dst, []byte(name))
		return spopBytes(append(dst, spopString), []byte(val))
	}
	ack := setVar(nil, "server", "r7")
	ack = setVar(ack, "decision", "00000000000000ab")
	if got := string(spoeVar(ack, spoeServerVar)); got != "r7" {
		t.Fatalf("server %q", got)
	}
	if got := string(spoeVar(ack, spoeDecisionVar)); got != "00000000000000ab" {
		t.Fatalf("decision %q", got)
	}
	if got := spoeVar(ack[:len(ack)-3], spoeDecisionVar); got != nil {
		t.Fatalf("a cut value: %q", got)
	}
}
