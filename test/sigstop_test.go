//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Issue 42 item 5: a hung turnout (SIGSTOP: the kernel accepts its
// connections, nothing answers) costs one route_timeout, and only to the
// requests in flight when it stopped; the calls the proxy abandoned meanwhile
// open no decisions once it resumes.
const (
	ssRate = 80 // requests per second, open loop
	// ssBefore and ssAfter: load before the stop and after SIGCONT.
	ssBefore, ssAfter = time.Second, 2 * time.Second
	ssRouteTimeout    = 500 * time.Millisecond // the stacks' proxy.route_timeout
	// The first timeouts come route_timeout after the stop; the requests
	// sent within the next route_timeout may still meet a breaker counting
	// its failures (nginx: breaker_failures per worker and per entry of
	// the turnout upstream; HAProxy: per Lua thread). A request started
	// later than ssFound after the stop must not wait on turnout.
	ssFound = 2 * ssRouteTimeout
	// ssLate: a request that waited on turnout's route_timeout takes at
	// least that long; mock replicas answer at once, and a loaded box
	// (load average 40 on 2 cores, with /tmp/hog beside) added up to ~460 ms.
	ssLate = ssRouteTimeout
	// ssMost: a request in flight at the stop waits one route_timeout (the
	// Lua hop may add its timeout connect: docs/reliability.md).
	ssMost = 2*ssRouteTimeout + 300*time.Millisecond
	// ssClosed: every decision closed this long after the load stopped.
	ssClosed = 5 * time.Second
)

// ssStall is how long turnout stays stopped: TURNOUT_SIGSTOP_STALL (e.g.
// 20s, the figure), 6 s by default.
func ssStall(t *testing.T) time.Duration {
	if v := os.Getenv("TURNOUT_SIGSTOP_STALL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("TURNOUT_SIGSTOP_STALL: %v", err)
		}
		return d
	}
	return 6 * time.Second
}

// ssReq is one request of sigstopLoad.
type ssReq struct {
	at  time.Duration // start, relative to the stop (negative: before)
	dur time.Duration
	err string
}

// sigstopLoad sends ssRate requests a second through the proxy at base,
// stops turnout after ssBefore for stall, resumes it and goes on for
// ssAfter; it returns every request, in start order.
func sigstopLoad(t *testing.T, tu *Turnout, base string, body []byte, hdr map[string]string, stall time.Duration) []ssReq {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var (
		mu      sync.Mutex
		out     []ssReq
		wg      sync.WaitGroup
		stopped time.Time
	)
	one := func(start time.Time) {
		defer wg.Done()
		r, err := Post(context.Background(), c, base+"/v1/chat/completions", body, hdr)
		q := ssReq{dur: time.Since(start)}
		switch {
		case err != nil:
			q.err = err.Error()
		case r.Status != 200 || r.Header.Get("X-Replica") == "":
			q.err = fmt.Sprintf("status %d from %q: %.200s", r.Status, r.Header.Get("X-Replica"), r.Body)
		}
		mu.Lock()
		q.at = start.Sub(stopped)
		out = append(out, q)
		mu.Unlock()
	}
	t.Cleanup(func() { _ = tu.Cmd.Process.Signal(syscall.SIGCONT) })
	tick := time.NewTicker(time.Second / ssRate)
	defer tick.Stop()
	begin := time.Now()
	// The stop time is set before any request goes out.
	mu.Lock()
	stopped = begin.Add(ssBefore)
	mu.Unlock()
	stopSent, resumed := false, false
	for now := range tick.C {
		el := now.Sub(begin)
		if el > ssBefore+stall+ssAfter {
			break
		}
		if !stopSent && el >= ssBefore {
			if err := tu.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatalf("SIGSTOP: %v", err)
			}
			mu.Lock()
			stopped = time.Now()
			mu.Unlock()
			stopSent = true
		}
		if !resumed && el >= ssBefore+stall {
			if err := tu.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatalf("SIGCONT: %v", err)
			}
			resumed = true
		}
		wg.Add(1)
		go one(now)
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// checkSigstop holds a path to item 5: no request failed, the requests in
// flight at the stop waited at most one route_timeout, none started after
// the first timeout waited ssLate, and every decision is closed within
// ssClosed of the load's end.
func checkSigstop(t *testing.T, path string, tu *Turnout, reqs []ssReq, stall time.Duration) {
	t.Helper()
	loadEnd := time.Now()
	var failed, early, late []string
	var durs []time.Duration
	inStall := 0
	for _, q := range reqs {
		desc := fmt.Sprintf("%v+%v", q.at.Round(time.Millisecond), q.dur.Round(time.Millisecond))
		switch {
		case q.err != "":
			failed = append(failed, desc+": "+q.err)
		case q.at < ssFound && q.dur > ssMost:
			early = append(early, desc)
		case q.at >= ssFound && q.at < stall && q.dur > ssLate:
			late = append(late, desc)
		}
		if q.at >= 0 && q.at < stall {
			inStall++
			durs = append(durs, q.dur)
		}
	}
	if len(durs) > 0 {
		nSlow, p99, worst := summarize(durs, 100*time.Millisecond)
		t.Logf("%s, turnout stopped %v: %d requests during the stall, %d over 100ms, %d over %v after the first timeout; p99 %v, worst %v",
			path, stall, inStall, nSlow, len(late), ssLate, p99, worst)
	}
	if inStall < ssRate*int(stall/time.Second)/2 { // the load ran (a busy box delays ticks)
		t.Errorf("%s: only %d requests during the stall", path, inStall)
	}
	if len(failed) > 0 {
		t.Errorf("%s: %d of %d requests failed (start relative to the stop + duration), e.g. %s", path, len(failed), len(reqs), strings.Join(failed[:min(5, len(failed))], "; "))
	}
	if len(early) > 0 {
		t.Errorf("%s: %d requests started before the first timeout waited over %v: %s", path, len(early), ssMost, strings.Join(early[:min(20, len(early))], " "))
	}
	if len(late) > 0 {
		t.Errorf("%s: %d requests started over %v after the stop (the first timeout) waited over %v: %s", path, len(late), ssFound, ssLate, strings.Join(late[:min(20, len(late))], " "))
	}
	var open float64
	for {
		v, err := Metric(t, tu.URL+"/metrics", "turnout_endpoint_inflight")
		if err == nil {
			open = v
			if v == 0 {
				break
			}
		}
		if time.Since(loadEnd) > ssClosed {
			abandoned, _ := Metric(t, tu.URL+"/metrics", "turnout_completions_total", `result="abandoned"`)
			t.Errorf("%s: %v decisions still open %v after the load stopped (%v closed as abandoned; metrics: %v)", path, open, ssClosed, abandoned, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	abandoned, _ := Metric(t, tu.URL+"/metrics", "turnout_completions_total", `result="abandoned"`)
	skipped, _ := Metric(t, tu.URL+"/metrics", "turnout_refusals_total", `reason="client_gone"`)
	t.Logf("%s: every decision closed %v after the load stopped; %v closed as abandoned, %v calls not decided (read past the proxy's timeout)",
		path, time.Since(loadEnd).Round(10*time.Millisecond), abandoned, skipped)
}

// TestSigstop: turnout stopped (SIGSTOP) under 80 requests/s through each
// path, fail_mode open, then resumed (docs/reliability.md, issue 42 item 5).
func TestSigstop(t *testing.T) {
	stall := ssStall(t)
	body := chatBody("llama", "s", "hung", false)
	t.Run("HAProxySPOE", func(t *testing.T) {
		s := startStackWith(t, "open", spoeDefault, depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "ss", 2, nil)})
		s.H.WaitServersUp(t, "turnout_spoe/agent0")
		checkSigstop(t, "HAProxy SPOE", s.T, sigstopLoad(t, s.T, s.H.URL, body, nil, stall), stall)
	})
	t.Run("HAProxyLua", func(t *testing.T) {
		s := startStack(t, "open", depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, "sl", 2, nil)})
		checkSigstop(t, "HAProxy Lua", s.T, sigstopLoad(t, s.T, s.H.URL, body, nil, stall), stall)
	})
	t.Run("NginxBody", func(t *testing.T) {
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "body", mocks: mocks(t, "sb", 2, nil)})
		checkSigstop(t, "nginx body", s.T, sigstopLoad(t, s.T, s.N.URL, body, nil, stall), stall)
	})
	t.Run("NginxHeader", func(t *testing.T) {
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "header", mocks: mocks(t, "sh", 2, nil)})
		checkSigstop(t, "nginx header", s.T, sigstopLoad(t, s.T, s.N.URL, body, map[string]string{"X-Model": "llama"}, stall), stall)
	})
}
