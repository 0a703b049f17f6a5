package haproxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route/contract"
)

func TestLiveRoutesWhereTurnoutSays(t *testing.T) {
	reps := []*replica{newReplica(t, "r0"), newReplica(t, "r1"), newReplica(t, "r2")}
	fr := newFakeRoute(t)
	fr.set(verdict("m_mixed", "r2", "r0,r1", "00000000000000aa"))
	e := startLive(t, liveOpts{routeURL: fr.srv.Listener.Addr().String(), replicas: reps})

	body := `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`
	for i := range 5 {
		a := e.post(t, "/v1/chat/completions?x=1", body, map[string]string{
			"X_SESSION-id":     "abc",
			"X-Turnout-Server": "r0", // a spoof must neither reach turnout nor choose
			"Authorization":    "Bearer secret",
		})
		if a.status != 200 || a.header.Get("X-Replica") != "r2" {
			t.Fatalf("request %d: status %d replica %q, want 200 r2", i, a.status, a.header.Get("X-Replica"))
		}
	}
	c := fr.lastCall()
	if got := c.header.Get("X-Session-Id"); got != "abc" {
		t.Errorf("session header to turnout = %q, want abc (from X_SESSION-id)", got)
	}
	if got := c.header.Get(contract.HdrOriginalURI); got != "/v1/chat/completions?x=1" {
		t.Errorf("%s = %q", contract.HdrOriginalURI, got)
	}
	if got := c.header.Get(contract.HdrOriginalMethod); got != "POST" {
		t.Errorf("%s = %q", contract.HdrOriginalMethod, got)
	}
	if string(c.body) != body {
		t.Errorf("body to turnout = %q", c.body)
	}
	for _, h := range []string{"Authorization", contract.HdrServer, contract.HdrBodyTruncated} {
		if c.header.Get(h) != "" {
			t.Errorf("turnout got header %s", h)
		}
	}
	reps[2].mu.Lock()
	spoof := reps[2].last.Get(contract.HdrServer)
	reps[2].mu.Unlock()
	if spoof != "" {
		t.Errorf("replica saw client X-Turnout-Server %q", spoof)
	}

	// A body larger than one buffer reaches turnout as a prefix, marked.
	big := `{"model":"m1","prompt":"` + strings.Repeat("x", 64<<10) + `"}`
	if a := e.post(t, "/v1/completions", big, nil); a.status != 200 {
		t.Fatalf("big body: status %d", a.status)
	}
	c = fr.lastCall()
	tr := c.header.Get(contract.HdrBodyTruncated)
	if !strings.HasSuffix(tr, "/"+strconv.Itoa(len(big))) || len(c.body) >= len(big) {
		t.Errorf("truncation header %q with %d of %d bytes", tr, len(c.body), len(big))
	}
	if reps[2].hits.Load() != 6 {
		t.Errorf("r2 hits = %d, want 6", reps[2].hits.Load())
	}

	// Paths outside /v1 and turnout's own paths are not served.
	for _, p := range []string{"/internal/route", "/metrics", "/v2/x"} {
		if a := e.post(t, p, body, nil); a.status != 404 {
			t.Errorf("%s: status %d, want 404", p, a.status)
		}
	}
}

func TestLiveRelaysRefusals(t *testing.T) {
	reps := []*replica{newReplica(t, "r0")}
	fr := newFakeRoute(t)
	fr.set(func(w http.ResponseWriter, _ routeCall) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(contract.HdrReason, "model_not_found")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"code":"model_not_found"}}`))
	})
	e := startLive(t, liveOpts{routeURL: fr.srv.Listener.Addr().String(), replicas: reps})
	a := e.post(t, "/v1/chat/completions", `{"model":"nope"}`, nil)
	if a.status != 404 || a.body != `{"error":{"code":"model_not_found"}}` || a.header.Get(contract.HdrReason) != "model_not_found" {
		t.Fatalf("got %d %q %v", a.status, a.body, a.header)
	}
	if reps[0].hits.Load() != 0 {
		t.Fatalf("refused request reached a replica")
	}
}

func TestLiveFallbackOrderWhenChosenIsDown(t *testing.T) {
	reps := []*replica{newReplica(t, "r0"), newReplica(t, "r1"), newReplica(t, "r2")}
	fr := newFakeRoute(t)
	fr.set(verdict("m_mixed", "r0", "r2,r1", "1"))
	e := startLive(t, liveOpts{routeURL: fr.srv.Listener.Addr().String(), replicas: reps})
	reps[0].srv.Close()
	// Wait until the health check marks r0 down (inter 200ms, fall 1).
	rt := e.runtime(t)
	deadline := time.Now().Add(5 * time.Second)
	for upCount(t, rt) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("r0 never marked down")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 5 {
		if a := e.post(t, "/v1/completions", `{"model":"m1"}`, nil); a.header.Get("X-Replica") != "r2" {
			t.Fatalf("status %d replica %q, want first fallback r2", a.status, a.header.Get("X-Replica"))
		}
	}
}

func TestLiveFailOpenBreaker(t *testing.T) {
	reps := []*replica{newReplica(t, "r0"), newReplica(t, "r1")}
	fr := newFakeRoute(t) // no answer set: every call is a 500 without a reason
	e := startLive(t, liveOpts{routeURL: fr.srv.Listener.Addr().String(), replicas: reps})
	for i := range 10 {
		if a := e.post(t, "/v1/completions", `{"model":"m1"}`, nil); a.status != 200 {
			t.Fatalf("request %d: status %d, want 200 (fail-open)", i, a.status)
		}
	}
	// breaker_failures 2, one thread: the third call onwards is skipped.
	if n := fr.calls.Load(); n != 2 {
		t.Fatalf("turnout called %d times, want 2 before the breaker opened", n)
	}
}

func TestLiveFailClosed(t *testing.T) {
	reps := []*replica{newReplica(t, "r0")}
	port := freeport.Port(t) // nothing listens: turnout is down
	e := startLive(t, liveOpts{routeURL: "127.0.0.1:" + strconv.Itoa(port), replicas: reps, failMode: config.FailClosed})
	var durs []time.Duration
	for i := range 6 {
		a := e.post(t, "/v1/completions", `{"model":"m1"}`, nil)
		if a.status != 503 || a.header.Get(contract.HdrReason) == "" {
			t.Fatalf("request %d: status %d reason %q, want 503 with a reason", i, a.status, a.header.Get(contract.HdrReason))
		}
		durs = append(durs, a.dur)
	}
	t.Logf("fail-closed latencies with turnout down: %v", durs)
	if reps[0].hits.Load() != 0 {
		t.Fatal("fail-closed request reached a replica")
	}
	if last := durs[len(durs)-1]; last > 100*time.Millisecond {
		t.Errorf("after the breaker opened a request took %v", last)
	}
}

func TestLiveStalledTurnoutTimesOut(t *testing.T) {
	reps := []*replica{newReplica(t, "r0")}
	fr := newFakeRoute(t)
	fr.set(func(w http.ResponseWriter, _ routeCall) { time.Sleep(2 * time.Second) })
	e := startLive(t, liveOpts{routeURL: fr.srv.Listener.Addr().String(), replicas: reps})
	a := e.post(t, "/v1/completions", `{"model":"m1"}`, nil)
	if a.status != 200 || a.dur > time.Second {
		t.Fatalf("stalled turnout: status %d after %v, want fail-open 200 after ~300ms", a.status, a.dur)
	}
	t.Logf("stalled turnout cost %v (route_timeout 300ms)", a.dur)
}
