package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// startupWait bounds a process's start, up to its first right answer: on a
// shared 2-core box a start can take tens of seconds, and the wait ends
// as soon as the answer comes.
const startupWait = time.Minute

// waitHTTP polls url until it answers want, the process dies or timeout.
func waitHTTP(ctx context.Context, p *proc, url string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	var last error
	for time.Now().Before(deadline) {
		if p != nil && p.Exited() {
			return fmt.Errorf("%s exited during startup: %v\n%s", p.name, p.Err(), p.logTail())
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("wait %s: %w", url, err)
		}
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait %s: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	msg := ""
	if p != nil {
		msg = "\n" + p.logTail()
	}
	return fmt.Errorf("wait %s: %w after %v (last: %v)%s", url, errNotReady, timeout, last, msg)
}

// errNotReady marks a component that did not come up.
var errNotReady = errors.New("not ready")

// getText fetches url's body.
func getText(ctx context.Context, url string) (string, error) {
	return getTextWithin(ctx, url, 5*time.Second)
}

// getTextWithin is getText with another timeout.
func getTextWithin(ctx context.Context, url string, timeout time.Duration) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("get %s: status %d", url, resp.StatusCode)
	}
	return string(b), nil
}
