package feedback

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route/contract"
)

// The UDP reader stays allocation-free in the whole process: socket read,
// source check, parse and the closing of the decision.
func TestFeedbackUDPAllocs(t *testing.T) {
	addr := freeport.Addr(t)
	s := mustServer(t, fmt.Sprintf(feedbackCfg, addr, "", "s3cret-token-0123456789"))
	c := listenFeedback(t, s, addr)
	waitReading(t, s, c)
	ctx := routeCtx(body4K(1), "")
	line := make([]byte, 0, 256)
	run := func() {
		ctx.Response.Reset()
		s.api.Handler(ctx)
		line = append(line[:0], "<134>Nov 29 21:00:00 haproxy[1]: turnout-done id="...)
		line = append(line, ctx.Response.Header.Peek(contract.HdrDecision)...)
		line = append(line, " srv=a status=200 ms=5 ttfb=1 tft=3 tok=s3cret-token-0123456789 be=llama_mixed tw=0 tc=0 retries=0 up=127.0.0.1:8001 term=----\n"...)
		before := s.lines.Load()
		if _, err := c.Write(line); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for s.lines.Load() == before {
			if time.Now().After(deadline) {
				t.Fatal("feedback line not read")
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	for range 50 {
		run()
	}
	if n := testing.AllocsPerRun(300, run); n != 0 {
		t.Fatalf("%v allocations per decision closed over UDP", n)
	}
}

// Lines queued faster than they are read are all read, each closing its
// decision, across several batches.
func TestFeedbackUDPBatches(t *testing.T) {
	addr := freeport.Addr(t)
	s := mustServer(t, fmt.Sprintf(feedbackCfg, addr, "", "s3cret-token-0123456789"))
	c := listenFeedback(t, s, addr)
	waitReading(t, s, c)
	const n = 100 // several recvmmsg batches
	ids := openIDs(t, s, n)
	for _, id := range ids {
		if _, err := fmt.Fprintf(c, "<134>Nov 29 21:00:00 haproxy[1]: turnout-done id=%s srv=a status=200 ms=3 ttfb=1 tok=s3cret-token-0123456789\n", id); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.lines.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d lines read", s.lines.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, e := range s.Snapshot().Pools()[0].Endpoints {
		if f := e.Inflight(); f != 0 {
			t.Errorf("%s: %d decisions still open", e.Name, f)
		}
	}
}

// waitReading sends lines without the tag (counted bad) until the
// listener reads them.
func waitReading(t *testing.T, s *testServer, c io.Writer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.bad.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("feedback listener not reading")
		}
		_, _ = c.Write([]byte("not a feedback line\n")) // refused until the listener is up
		time.Sleep(10 * time.Millisecond)
	}
}
