package feedback

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// serveStream runs ServeStream on a loopback port and returns its address.
func serveStream(t *testing.T, s *testServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.ServeStream(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("ServeStream: %v", err)
		}
	})
	return ln.Addr().String()
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
	c, err := net.Dial("tcp", serveStream(t, s))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
			c, err := net.Dial("tcp", serveStream(t, s))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			go func() { _, _ = c.Write([]byte(octet("turnout-done id="+ids[0]+" srv=a status=200 ms=1") + tc.tail)) }()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			// EOF, or a reset when turnout closed with bytes unread.
			var ne net.Error
			if _, err := c.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
				t.Fatalf("read after bad framing: %v, want the connection closed by turnout", err)
			}
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
	c, err := net.Dial("tcp", serveStream(t, s))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte(octet("turnout-done id=" + ids[0] + " srv=a status=200 ms=1")))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadByte(); err == nil {
		t.Fatal("turnout wrote to a feedback connection")
	}
	waitFor(t, "the connection rejected", func() bool { return s.rejected.Load() == 1 })
	if totalInflight(s) != 1 || completed(s) != 0 {
		t.Fatalf("a rejected source closed a decision: inflight %d completed %d", totalInflight(s), completed(s))
	}
}

// Lines already read when turnout stops are handled; Serve returns and
// closes the connections it holds.
func TestFeedbackStreamStops(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", ""))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.ServeStream(ctx, ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids := openIDs(t, s, 1)
	_, _ = c.Write([]byte(octet("turnout-done id=" + ids[0] + " srv=a status=200 ms=1")))
	waitFor(t, "the line read", func() bool { return totalInflight(s) == 0 })
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeStream did not return after its context ended")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection after stop: %v, want EOF", err)
	}
}
