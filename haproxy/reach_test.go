package haproxy

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// syncBuf is a log sink safe for the watcher's goroutine.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWatchReachableLogsConnected: after "not reachable", the watcher logs
// "HAProxy connected" once the runtime API answers, and only then.
func TestWatchReachableLogsConnected(t *testing.T) {
	var buf syncBuf
	log := zerolog.New(&buf)
	var calls atomic.Int32
	s, err := NewSyncer(SyncOptions{HAProxyBin: "-", dial: func(context.Context, string) (RuntimeClient, error) {
		if calls.Add(1) < 2 {
			return nil, errors.New("connection refused")
		}
		return nil, nil
	}}, &log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.watchReachable(ctx, "/run/admin.sock")
	s.watchReachable(ctx, "/run/admin.sock") // a second call while watching adds no watcher
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "HAProxy connected") {
		if time.Now().After(deadline) {
			t.Fatalf("no connected line after %d dials: %q", calls.Load(), buf.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("dialled %d times, want 2 (one refused, one answered)", n)
	}
	if !strings.Contains(buf.String(), `"socket":"/run/admin.sock"`) || !strings.Contains(buf.String(), `"level":"info"`) {
		t.Errorf("connected line lacks socket or info level: %s", buf.String())
	}
	if n := strings.Count(buf.String(), "HAProxy connected"); n != 1 {
		t.Errorf("%d connected lines, want 1", n)
	}
}
