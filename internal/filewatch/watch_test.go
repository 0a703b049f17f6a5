package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// watcher runs poll on path with ticks the test sends; look returns once
// the watcher has looked at the file.
type watcher struct {
	tick, looked chan time.Time
	calls        atomic.Int64
}

func startPoll(t *testing.T, path string) *watcher {
	return startPollFrom(t, path, Snapshot{})
}

// startPollFrom is startPoll from an earlier look (Take).
func startPollFrom(t *testing.T, path string, from Snapshot) *watcher {
	t.Helper()
	w := &watcher{tick: make(chan time.Time), looked: make(chan time.Time)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		poll(ctx, path, from, w.tick, func() { w.calls.Add(1) }, func() { w.looked <- time.Time{} })
	}()
	t.Cleanup(func() { cancel(); <-done })
	w.look() // the watcher has taken its first look
	return w
}

func (w *watcher) look() {
	w.tick <- time.Time{}
	<-w.looked
}

// write sets path's content and a modification time distinct from any
// earlier one (a coarse clock would otherwise hide a change from stat).
func write(t *testing.T, path, content string, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

func TestPoll(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "turnout.yaml")
	mod := time.Now().Add(-time.Hour)
	next := func() time.Time { mod = mod.Add(time.Second); return mod }
	write(t, path, "a: 1\n", next())
	w := startPoll(t, path)

	steps := []struct {
		name  string
		do    func()
		calls int64 // changes seen so far
	}{
		{"nothing", func() {}, 0},
		{"touched, same bytes", func() { write(t, path, "a: 1\n", next()) }, 0},
		{"content changed", func() { write(t, path, "a: 2\n", next()) }, 1},
		{"rename-replace (editors)", func() {
			tmp := filepath.Join(dir, ".turnout.yaml.swp")
			write(t, tmp, "a: 3\n", next())
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		}, 2},
		{"removed", func() { _ = os.Remove(path) }, 2},
		{"back with the same content", func() { write(t, path, "a: 3\n", next()) }, 2},
		{"back changed", func() { write(t, path, "a: 4\n", next()) }, 3},
	}
	for _, st := range steps {
		st.do()
		w.look()
		if got := w.calls.Load(); got != st.calls {
			t.Fatalf("%s: %d changes seen, want %d", st.name, got, st.calls)
		}
	}
}

// A Kubernetes ConfigMap volume: path -> ..data/file, ..data a symlink
// swapped atomically to a new timestamped directory.
func TestPollConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	mod := time.Now().Add(-time.Hour)
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		mod = mod.Add(time.Second)
		write(t, filepath.Join(dir, name, "turnout.yaml"), content, mod)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "a: 1\n")
	path := filepath.Join(dir, "turnout.yaml")
	if err := os.Symlink(filepath.Join("..data", "turnout.yaml"), path); err != nil {
		t.Fatal(err)
	}
	w := startPoll(t, path)
	version("..v2", "a: 2\n")
	w.look()
	if got := w.calls.Load(); got != 1 {
		t.Fatalf("after the swap: %d changes seen, want 1", got)
	}
}

// Poll returns when its context ends.
func TestPollStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Poll(ctx, path, time.Millisecond, Snapshot{}, func() {}) }()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Poll still running 5s after its context ended")
	}
}

// A file rewritten within one tick of the kernel's coarse file clock keeps
// its modification time (and here its size): while that time is recent the
// watcher compares bytes anyway; once it is old, an unchanged stamp is
// trusted and the file is not read.
func TestPollSameStamp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turnout.yaml")
	recent := time.Now().Add(time.Minute) // ahead, so a slow machine cannot age it
	write(t, path, "listen: a\n", recent)
	w := startPoll(t, path)
	write(t, path, "listen: b\n", recent)
	w.look()
	if got := w.calls.Load(); got != 1 {
		t.Fatalf("same recent stamp, new bytes: %d changes seen, want 1", got)
	}
	w.look()
	if got := w.calls.Load(); got != 1 {
		t.Fatalf("nothing changed since: %d changes seen, want 1", got)
	}

	old := filepath.Join(t.TempDir(), "old.yaml")
	stamp := time.Now().Add(-time.Hour)
	write(t, old, "listen: a\n", stamp)
	w = startPoll(t, old)
	write(t, old, "listen: b\n", stamp)
	w.look()
	if got := w.calls.Load(); got != 0 {
		t.Fatalf("an hour-old stamp put back: %d changes seen, want 0 (stat alone decides)", got)
	}
}

// A change made after the process took its look (Take, before loading the
// file) and before the watcher started is a change.
func TestPollFromSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turnout.yaml")
	mod := time.Now().Add(-time.Hour)
	write(t, path, "a: 1\n", mod)
	from := Take(path)
	write(t, path, "a: 2\n", mod.Add(time.Second))
	w := startPollFrom(t, path, from)
	if got := w.calls.Load(); got != 1 {
		t.Fatalf("changed before the watcher started: %d changes seen, want 1", got)
	}

	missing := filepath.Join(t.TempDir(), "later.yaml")
	from = Take(missing)
	w = startPollFrom(t, missing, from)
	write(t, missing, "a: 1\n", mod)
	w.look()
	if got := w.calls.Load(); got != 1 {
		t.Fatalf("a file that appears: %d changes seen, want 1", got)
	}
}
