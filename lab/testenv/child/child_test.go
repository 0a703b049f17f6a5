package child

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// waitExited waits (bounded) for p to end.
func waitExited(t *testing.T, p *Process) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !p.Exited() {
		if time.Now().After(deadline) {
			t.Fatal("process did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStartLogsAndEnds(t *testing.T) {
	log := filepath.Join(t.TempDir(), "echo.log")
	p, err := Start(exec.Command("sh", "-c", "echo out; echo err >&2; exit 3"), log)
	if err != nil {
		t.Fatal(err)
	}
	waitExited(t, p)
	if p.Err() == nil {
		t.Error("exit 3 reported no error")
	}
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "out") || !strings.Contains(string(b), "err") {
		t.Errorf("log %q lacks the output", b)
	}
}

func TestStopTermThenKill(t *testing.T) {
	dir := t.TempDir()
	// Ends at SIGTERM.
	p, err := Start(exec.Command("sleep", "60"), filepath.Join(dir, "a.log"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Exited() || p.Err() != nil {
		t.Fatal("a running process reported as ended")
	}
	p.Stop(30 * time.Second)
	if !p.Exited() {
		t.Fatal("Stop returned before the end")
	}
	p.Stop(time.Second) // a second Stop is harmless
	// Ignores SIGTERM: killed after the grace.
	q, err := Start(exec.Command("sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"), filepath.Join(dir, "b.log"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for b, _ := os.ReadFile(filepath.Join(dir, "b.log")); !strings.Contains(string(b), "ready"); b, _ = os.ReadFile(filepath.Join(dir, "b.log")) {
		if time.Now().After(deadline) {
			t.Fatal("trap not set")
		}
		time.Sleep(10 * time.Millisecond)
	}
	q.Stop(100 * time.Millisecond)
	if !q.Exited() {
		t.Fatal("Stop returned before the kill ended it")
	}
}

func TestStartFails(t *testing.T) {
	if _, err := Start(exec.Command("/nonexistent/binary"), filepath.Join(t.TempDir(), "x.log")); err == nil {
		t.Error("a missing binary started")
	}
	if _, err := Start(exec.Command("true"), filepath.Join(t.TempDir(), "no", "dir", "x.log")); err == nil {
		t.Error("a log in a missing directory was created")
	}
}
