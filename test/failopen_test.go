//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"
)

// failOpenDelays kills turnout (SIGKILL: no goodbye to the proxy) and
// returns the latency of n requests through the proxy after it, failing
// the test on any request not served, and the p99 of the same load with
// turnout up just before: what the machine itself costs a request now.
func failOpenDelays(t *testing.T, tu *Turnout, base, model string, extra map[string]string, n int) (d []time.Duration, upP99 time.Duration) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	one := func(tag string) func() (time.Duration, string) {
		return func() (time.Duration, string) {
			r, err := Post(context.Background(), c, base+"/v1/chat/completions", chatBody(model, "s", tag, false), extra)
			switch {
			case err != nil:
				return 0, err.Error()
			case r.Status != 200:
				return 0, fmt.Sprintf("%d %s", r.Status, r.Body)
			}
			return r.Dur, ""
		}
	}
	// Warm (keep-alive and SPOE connections open), then the baseline.
	killedLoad(t, time.Now(), 40, "warm-up request", "duration", one("warm"))
	_, upP99, _ = summarize(killedLoad(t, time.Now(), 300, "request with turnout up", "duration", one("up")), 0)
	_ = tu.Cmd.Process.Signal(syscall.SIGKILL)
	<-tu.done
	killed := time.Now()
	// Concurrent clients, as in production: requests already queued on a
	// dead agent connection show up here, not with one client at a time.
	return killedLoad(t, killed, n, "request", "duration", one("down")), upP99
}

// killedLoad makes n requests from 8 clients after turnout was killed at
// killed (one makes a request and returns its delay, or a failure),
// fails the test on any failure, and returns the delays in start order,
// logging the slow ones with when they started.
func killedLoad(t *testing.T, killed time.Time, n int, what, delay string, one func() (time.Duration, string)) []time.Duration {
	t.Helper()
	type res struct {
		at, dur time.Duration
		err     string
	}
	ch := make(chan res, n)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				at := time.Since(killed)
				dur, msg := one()
				ch <- res{at: at, dur: dur, err: msg}
			}
		}()
	}
	wg.Wait()
	close(ch)
	var all []res
	for r := range ch {
		if r.err != "" {
			t.Fatalf("turnout killed: a %s failed: %s", what, r.err)
		}
		all = append(all, r)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at < all[j].at })
	out := make([]time.Duration, len(all))
	var slowAt []string
	for i, r := range all {
		out[i] = r.dur
		if r.dur > 100*time.Millisecond && len(slowAt) < 40 {
			slowAt = append(slowAt, fmt.Sprintf("%v+%v", r.at.Round(time.Millisecond), r.dur.Round(time.Millisecond)))
		}
	}
	if len(slowAt) > 0 {
		t.Logf("slow %ss (started at + %s): %v", what, delay, slowAt)
	}
	return out
}

// summarize reports the share of requests slower than slow, the p99 and the max.
func summarize(d []time.Duration, slow time.Duration) (nSlow int, p99, worst time.Duration) {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	for _, x := range s {
		if x > slow {
			nSlow++
		}
	}
	return nSlow, s[len(s)*99/100], s[len(s)-1]
}

// Issue 16 finding 4: with turnout killed, every path fails open at once.
// SPOE was reported to wait timeout processing (500 ms) on ~11% of requests
// for the whole outage. A request may be slow only while the proxy finds
// out (the decisions in flight at the kill); none after that. The figures
// logged here are docs/reliability.md's fail-open row.
func TestFailOpenDelay(t *testing.T) {
	const n, slow = 1500, 100 * time.Millisecond
	// allowed: how many requests after the first 100 may be late: later
	// than the same load's p99 with turnout up plus 300 ms, which is under
	// any wait on a timeout (SPOE's timeout processing is 500 ms) and over
	// what a loaded machine adds to a request (the p99 measured on it,
	// just before: a CPU hog on both cores makes it hundreds of ms).
	check := func(t *testing.T, path string, d []time.Duration, upP99 time.Duration, allowed int) {
		late := upP99 + 300*time.Millisecond
		nSlow, p99, worst := summarize(d, slow)
		t.Logf("fail-open %s: %d/%d requests over %v after the kill; p99 %v, worst %v; turnout up: p99 %v", path, nSlow, len(d), slow, p99, worst, upP99)
		// Slow requests may only come first, while the proxy finds out.
		nLate := 0
		for _, x := range d[100:] {
			if x > late {
				nLate++
			}
		}
		if nLate > allowed {
			t.Errorf("%s: %d of the requests after the first 100 took over %v (turnout dead the whole time; %d allowed)", path, nLate, late, allowed)
		}
	}
	t.Run("HAProxyLua", func(t *testing.T) {
		s := startStack(t, "open", depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "fl", 2, nil)})
		d, up := failOpenDelays(t, s.T, s.H.URL, "llama", nil, n)
		check(t, "HAProxy Lua", d, up, 0)
	})
	t.Run("HAProxySPOE", func(t *testing.T) {
		s := startStackWith(t, "open", FreeAddr(t), depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "fs", 2, nil)})
		s.H.WaitServersUp(t, "turnout_spoe/agent0")
		// Only the decisions already queued at the kill wait timeout
		// processing: the decision is sent only while the agent's server
		// is up (issue 28), which also ended the waves of a pair of slow
		// requests every 500 ms that 1% used to be allowed for.
		d, up := failOpenDelays(t, s.T, s.H.URL, "llama", nil, n)
		check(t, "HAProxy SPOE", d, up, 0)
	})
	t.Run("NginxBody", func(t *testing.T) {
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "body", mocks: mocks(t, "fb", 2, nil)})
		d, up := failOpenDelays(t, s.T, s.N.URL, "llama", nil, n)
		check(t, "nginx body", d, up, 0)
	})
	t.Run("NginxHeader", func(t *testing.T) {
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "header", mocks: mocks(t, "fh", 2, nil)})
		d, up := failOpenDelays(t, s.T, s.N.URL, "llama", map[string]string{"X-Model": "llama"}, n)
		check(t, "nginx header", d, up, 0)
	})
}
