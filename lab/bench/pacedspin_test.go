//go:build linux

package bench

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestSpinPaced: the spinning pacer sends every request of the run on its
// schedule's count, reads each whole answer, and closes each decision over
// feedback (one line per answer); so does its sleeping real-time form.
// The sleeping one must not burn its CPU: its thread's CPU time stays
// well under the run's length (the spinning one's is all it is given).
func TestSpinPaced(t *testing.T) {
	spinPacedRun(t, PacerSpin)
	runtime.LockOSThread()
	err := setThreadFIFO(1)
	_ = setThreadFIFO(0)
	runtime.UnlockOSThread()
	if err != nil {
		t.Skipf("no real-time scheduling here for the %s pacer: %v", PacerFIFO, err)
	}
	if res := spinPacedRun(t, PacerFIFO); res.SenderCPU <= 0 || res.SenderCPU > res.Elapsed/2 {
		t.Errorf("the %s pacer's thread used %s of CPU in %s", PacerFIFO, res.SenderCPU, res.Elapsed)
	}
}

// spinPacedRun runs pacer against an in-process trivial server and checks
// its run.
func spinPacedRun(t *testing.T, pacer string) *LoadResult {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewTrivialServer()
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown() }()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	// Read the lines while they come: a socket's buffer holds a few hundred.
	lines := make(chan error, 1)
	const rate, d = 2000.0, 300 * time.Millisecond
	want := int(rate * d.Seconds())
	go func() {
		buf := make([]byte, 512)
		for i := range want {
			_ = pc.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, _, err := pc.ReadFrom(buf); err != nil {
				lines <- fmt.Errorf("feedback line %d of %d: %w", i+1, want, err)
				return
			}
		}
		lines <- nil
	}()
	bodies := CostBodiesSized(8, "llama", 1, false, 1, 8<<10)
	tg := routeTarget("trivial", 0, "", ln.Addr().String(), bodies, feedbackTo{addr: pc.LocalAddr().String(), open: 0}, pacer)
	res, err := tg.spin(context.Background(), 4, rate, d)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != want || res.Errors != 0 || len(res.Latencies) != want || len(res.Late) != want {
		t.Fatalf("requests %d errors %d (%v) latencies %d late %d, want %d each", res.Requests, res.Errors, res.FirstErr, len(res.Latencies), len(res.Late), want)
	}
	for i, l := range res.Latencies {
		if l <= 0 {
			t.Fatalf("latency %d: %v", i, l)
		}
	}
	if err := <-lines; err != nil {
		t.Fatal(err)
	}
	return res
}
