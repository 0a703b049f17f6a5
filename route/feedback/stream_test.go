package feedback

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// dialStream runs ServeStream on a loopback port and connects to it; stop
// ends ServeStream and says whether it returned within 5 s, without error.
func dialStream(t *testing.T, s *testServer) (c net.Conn, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.ServeStream(ctx, ln) }()
	stop = sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("ServeStream did not return after its context ended")
		}
	})
	if c, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return c, stop
}

// wantClosed fails unless turnout closes c within 5 s (EOF, or a reset
// when it closed with bytes unread).
func wantClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: read %v, want the connection closed by turnout", what, err)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func octet(msg string) string { return fmt.Sprintf("%d %s", len(msg), msg) }

// HAProxy's ring forwards octet-counted messages, several per write and
// cut anywhere; newline-framed messages on the same connection work too.
// Every line closes its decision.
func TestFeedbackStreamFraming(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", ""))
	ids := openIDs(t, s, 5)
	c, _ := dialStream(t, s)
	line := func(i int) string { return "turnout-done id=" + ids[i] + " srv=a status=200 ms=3 ttfb=1" }
	stream := octet(line(0)) + // format raw
		octet("<134>Nov 21 10:00:00 haproxy[1]: "+line(1)) + octet(line(2)+"\n") + // rfc3164, a trailing newline
		"<134>Nov 21 10:00:00 haproxy[1]: " + line(3) + "\n" + // non-transparent framing
		octet(line(4))
	for i := 0; i < len(stream); i += 7 { // cut mid-length and mid-message
		if _, err := c.Write([]byte(stream[i:min(i+7, len(stream))])); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every decision closed", func() bool { return totalInflight(s) == 0 })
	if got := completed(s); got != 5 || s.bad.Load() != 0 {
		t.Fatalf("completed %d bad %d, want 5 and 0", got, s.bad.Load())
	}
}

// Broken framing ends the connection (counted as bad); lines before it count.
func TestFeedbackStreamBadFraming(t *testing.T) {
	for _, tc := range []struct{ name, tail string }{
		{"letter in the length", "12x turnout-done"},
		{"length over the limit", fmt.Sprintf("%d ", maxFrame+1)},
		{"line over the limit", "<134>" + strings.Repeat("x", maxFrame+10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", ""))
			ids := openIDs(t, s, 1)
			c, _ := dialStream(t, s)
			go func() { _, _ = c.Write([]byte(octet("turnout-done id="+ids[0]+" srv=a status=200 ms=1") + tc.tail)) }()
			wantClosed(t, c, "bad framing")
			if totalInflight(s) != 0 || s.bad.Load() != 1 {
				t.Fatalf("inflight %d bad %d, want 0 and 1", totalInflight(s), s.bad.Load())
			}
		})
	}
}

// A connection from outside feedback.sources is closed unread.
func TestFeedbackStreamSourceChecked(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "10.0.0.0/8", ""))
	ids := openIDs(t, s, 1)
	c, _ := dialStream(t, s)
	_, _ = c.Write([]byte(octet("turnout-done id=" + ids[0] + " srv=a status=200 ms=1")))
	wantClosed(t, c, "a source outside feedback.sources")
	waitFor(t, "the connection rejected", func() bool { return s.rejected.Load() == 1 })
	if totalInflight(s) != 1 || completed(s) != 0 {
		t.Fatalf("a rejected source closed a decision: inflight %d completed %d", totalInflight(s), completed(s))
	}
}

// Lines already read when turnout stops are handled; Serve returns and
// closes the connections it holds.
func TestFeedbackStreamStops(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", ""))
	c, stop := dialStream(t, s)
	ids := openIDs(t, s, 1)
	_, _ = c.Write([]byte(octet("turnout-done id=" + ids[0] + " srv=a status=200 ms=1")))
	waitFor(t, "the line read", func() bool { return totalInflight(s) == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, c, "after stop")
}
