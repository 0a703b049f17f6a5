package route

import (
	"bytes"
	"context"
	"os"
	"time"
)

// WatchFile calls reload whenever path's content changes. It polls (stat,
// then compare bytes) rather than using inotify: polling also sees editors'
// rename-replace and Kubernetes ConfigMap symlink swaps, needs no extra
// dependency, and once a second is plenty for config changes.
func WatchFile(ctx context.Context, path string, every time.Duration, reload func()) {
	last, _ := os.ReadFile(path)
	var lastMod time.Time
	if fi, err := os.Stat(path); err == nil {
		lastMod = fi.ModTime()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(path)
		if err != nil || fi.ModTime().Equal(lastMod) {
			continue
		}
		lastMod = fi.ModTime()
		cur, err := os.ReadFile(path)
		if err != nil || bytes.Equal(cur, last) {
			continue
		}
		last = cur
		reload()
	}
}
