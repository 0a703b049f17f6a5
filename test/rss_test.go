//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rssKiB reads a process's resident set size.
func rssKiB(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestSlowBodyAttackRSS (issue 16 finding 2; runs with `make soak`, the
// figure is docs/reliability.md's) opens 300 connections to turnout's HTTP
// listener, each announcing a 2 MiB body and sending one byte a second for
// 20 s (turnout answers 408 when a chunk is late, so each reconnects), and
// compares turnout's peak RSS with its idle RSS. Goal: at most 2x idle.
func TestSlowBodyAttackRSS(t *testing.T) {
	if os.Getenv("TURNOUT_SOAK") == "" {
		t.Skip("set TURNOUT_SOAK (make soak) to run the slow-body attack")
	}
	addr := FreeAddr(t)
	tu := StartTurnout(t, addr, serveCfg(addr, "a", "b"), "--watch", "0")
	pid := tu.Cmd.Process.Pid
	time.Sleep(2 * time.Second)
	idle := rssKiB(t, pid)
	const conns, attack = 300, 20 * time.Second
	stop := time.Now().Add(attack)
	var wg sync.WaitGroup
	var answered, dialErr sync.Map
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					dialErr.Store(i, err)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				fmt.Fprintf(c, "POST /internal/route HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 2<<20)
				for time.Now().Before(stop) {
					if _, err := c.Write([]byte{' '}); err != nil {
						answered.Store(i, true)
						break
					}
					time.Sleep(time.Second)
				}
				c.Close()
			}
		}()
	}
	peak := idle
	for time.Now().Before(stop) {
		peak = max(peak, rssKiB(t, pid))
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	time.Sleep(6 * time.Second) // the spike's memory goes back (route/body.go)
	after := rssKiB(t, pid)
	n := 0
	answered.Range(func(any, any) bool { n++; return true })
	t.Logf("slow-body attack (%d conns x 2 MiB Content-Length at 1 B/s for %v): RSS idle %d KiB, peak %d KiB (%.2fx), 6 s after %d KiB; %d connections were cut by turnout",
		conns, attack, idle, peak, float64(peak)/float64(idle), after, n)
	if peak > 2*idle {
		t.Errorf("peak RSS %d KiB is over 2x idle (%d KiB)", peak, idle)
	}
	// turnout still answers.
	WaitHTTP(t, tu.URL+"/healthz", 5*time.Second)

	// A spike of whole bodies: 300 concurrent requests of max_body
	// (256 KiB), over the 64 MiB budget. The buffers' memory must go back
	// to the OS once they are done.
	body := []byte(`{"model":"llama","prompt":"` + strings.Repeat("p", 256<<10-40) + `"}`)
	var mu sync.Mutex
	statuses := map[int]int{}
	peak2 := after
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
				r := rssKiB(t, pid)
				mu.Lock()
				peak2 = max(peak2, r)
				mu.Unlock()
			}
		}
	}()
	for range 3 {
		var wg2 sync.WaitGroup
		for range conns {
			wg2.Add(1)
			go func() {
				defer wg2.Done()
				st, _ := rawHTTP(t, tu.URL, "POST", "/internal/route", body, nil)
				mu.Lock()
				statuses[st]++
				mu.Unlock()
			}()
		}
		wg2.Wait()
	}
	close(done)
	time.Sleep(8 * time.Second)
	settled := rssKiB(t, pid)
	t.Logf("whole-body spike (3 x %d concurrent 256 KiB bodies): statuses %v; RSS peak %d KiB, 8 s after %d KiB (%.2fx idle)",
		conns, statuses, peak2, settled, float64(settled)/float64(idle))
	if settled > 2*idle {
		t.Errorf("RSS %d KiB 8 s after the spike, over 2x idle (%d KiB): body memory not returned", settled, idle)
	}
}
