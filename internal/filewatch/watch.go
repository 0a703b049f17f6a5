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

// Poll calls changed whenever path's content differs from what it was at
// the previous look, looking every interval, until ctx ends. A file that
// is missing or unreadable for a while is no change; its content when it
// comes back is compared with the last content read.
func Poll(ctx context.Context, path string, every time.Duration, changed func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	poll(ctx, path, t.C, changed, func() {})
}

// poll looks at path on each tick, calling looked after each look (a test
// sends the ticks and waits for the looks).
func poll(ctx context.Context, path string, tick <-chan time.Time, changed, looked func()) {
	last, _ := os.ReadFile(path)
	var lastMod time.Time
	if fi, err := os.Stat(path); err == nil {
		lastMod = fi.ModTime()
	}
	look := func() {
		fi, err := os.Stat(path)
		if err != nil || fi.ModTime().Equal(lastMod) {
			return
		}
		lastMod = fi.ModTime()
		cur, err := os.ReadFile(path)
		if err != nil || bytes.Equal(cur, last) {
			return
		}
		last = cur
		changed()
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
