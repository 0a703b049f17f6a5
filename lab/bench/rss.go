package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/proxyconf"
)

// Memory of the proxy processes, read from /proc (Linux only; elsewhere the
// RSS columns stay empty).

// procTree returns pid and its descendants.
func procTree(pid int) []int { return proxyconf.Tree(pid) }

// pageSize converts statm pages to bytes.
var pageSize = int64(os.Getpagesize())

// rssBytes sums the resident set of pids (statm's second field); processes
// that are gone count 0.
func rssBytes(pids []int) int64 {
	var sum int64
	for _, p := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/statm")
		if err != nil {
			continue
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err == nil {
			sum += n * pageSize
		}
	}
	return sum
}

// rssSampler records the peak RSS of a process set while a load runs.
type rssSampler struct {
	pids []int
	stop chan struct{}
	done chan struct{}
	peak int64
}

// sampleRSS starts sampling pids every interval until stopped; nil pids
// give a sampler that reports 0.
func sampleRSS(pids []int, interval time.Duration) *rssSampler {
	s := &rssSampler{pids: pids, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if len(pids) == 0 {
			<-s.stop
			return
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.peak = max(s.peak, rssBytes(pids))
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends sampling and returns the peak in MiB.
func (s *rssSampler) Stop() float64 {
	close(s.stop)
	<-s.done
	return float64(s.peak) / (1 << 20)
}

// IdleResult is the proxy's memory with n idle keep-alive client
// connections, each of which has carried one routed request.
type IdleResult struct {
	Conns        int
	Before, With float64 // MiB
	Errors       int
}

// idleKeepAlive opens n connections to addr, sends one request on each
// (bodies cycled, in batches so the proxy is not flooded), reads the answer
// and leaves the connection open and idle; then it reads the proxy's RSS,
// closes everything and returns. Loopback only, bounded by n and ctx.
func idleKeepAlive(ctx context.Context, addr, path string, pids []int, bodies []CostBody, n int) (*IdleResult, error) {
	res := &IdleResult{Conns: n, Before: float64(rssBytes(pids)) / (1 << 20)}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var mu sync.Mutex
	const batch = 50
	for start := 0; start < n; start += batch {
		var wg sync.WaitGroup
		for i := start; i < min(start+batch, n); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := oneKeepAlive(ctx, addr, path, &bodies[i%len(bodies)])
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					res.Errors++
					return
				}
				conns = append(conns, c)
			}()
		}
		wg.Wait()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("idle keep-alive: %w", err)
		}
	}
	// Let the proxy settle (buffers released after the last response).
	time.Sleep(500 * time.Millisecond)
	res.With = float64(rssBytes(pids)) / (1 << 20)
	return res, nil
}

// oneKeepAlive sends one POST on a new connection and returns the
// connection once the whole answer is read.
func oneKeepAlive(ctx context.Context, addr, path string, b *CostBody) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Session-Id: %s\r\nContent-Length: %d\r\n\r\n",
		path, addr, b.Session, len(b.Body))
	if _, err := c.Write(append([]byte(req), b.Body...)); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("read: %w", err)
	}
	_, err = bufio.NewReader(resp.Body).WriteTo(discard{})
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		_ = c.Close()
		return nil, fmt.Errorf("answer: status %d close %v: %v", resp.StatusCode, resp.Close, err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
