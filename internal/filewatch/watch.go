// Package filewatch tells a long-running process that a file it loaded has
// changed: turnout serve reloads its config file with it. It polls (stat,
// then compare bytes) rather than using inotify (fsnotify): polling also
// sees editors' rename-replace and Kubernetes ConfigMap symlink swaps,
// which inotify watches on the file itself miss, and once a second is
// plenty for config changes.
package filewatch

import (
	"bytes"
	"context"
	"os"
	"time"
)

// racyWindow: a file whose modification time is this close to the moment
// it was read may change again without its time moving (the kernel stamps
// files from a coarse clock, some filesystems to the second), so until it
// is older than this its bytes are compared on every look, as git does for
// racily clean index entries.
const racyWindow = 2 * time.Second

// Snapshot is a file as one look saw it (at: when; zero: no look taken).
// Take it before loading the file, so a change made while the process
// starts is a change to the watcher.
type Snapshot struct {
	content []byte
	mod     time.Time
	size    int64
	at      time.Time
}

// Take looks at path now. A missing or unreadable file has no content: its
// content when it comes is a change.
func Take(path string) Snapshot {
	s := Snapshot{at: time.Now()}
	if fi, err := os.Stat(path); err == nil {
		s.mod, s.size = fi.ModTime(), fi.Size()
	}
	s.content, _ = os.ReadFile(path)
	return s
}

// Poll calls changed whenever path's content differs from what it was at
// the previous look, starting from the look from (Take; the zero Snapshot
// is a look Poll takes as it starts), looking every interval, until ctx
// ends. A file that is missing or unreadable for a while is no change; its
// content when it comes back is compared with the last content read.
func Poll(ctx context.Context, path string, every time.Duration, from Snapshot, changed func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	poll(ctx, path, from, t.C, changed, func() {})
}

// poll looks at path on each tick, calling looked after each look (a test
// sends the ticks and waits for the looks).
func poll(ctx context.Context, path string, last Snapshot, tick <-chan time.Time, changed, looked func()) {
	if last.at.IsZero() {
		last = Take(path)
	}
	look := func() {
		fi, err := os.Stat(path)
		if err != nil {
			return
		}
		if fi.ModTime().Equal(last.mod) && fi.Size() == last.size && last.at.Sub(last.mod) > racyWindow {
			return
		}
		at := time.Now()
		cur, err := os.ReadFile(path)
		if err != nil {
			return
		}
		same := bytes.Equal(cur, last.content)
		last = Snapshot{content: cur, mod: fi.ModTime(), size: fi.Size(), at: at}
		if !same {
			changed()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		look()
		looked()
	}
}
