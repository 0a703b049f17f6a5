package spoe

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/testenv/freeport"
)

// liveEnv is HAProxy with the SPOE snippets in front of four replicas, with
// turnout (route.Decider + Agent) in process.
type liveEnv struct {
	dir, listen string
	reps        map[string]*replica
	tp          *turnoutProc
}

const liveYAML = `
session_headers: [x-session-id]
fallbacks: 2
max_body: 262144
feedback: {syslog: %s}
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    # Sessions never spill here, whatever the in-flight counts.
    policy: {name: session-hash, params: {min_inflight: 100000}}
    pools:
      - role: mixed
        endpoints:
          - {name: r0, address: %s}
          - {name: r1, address: %s}
          - {name: r2, address: %s}
  - name: qwen
    models: [qwen]
    policy: {name: round-robin}
    pools:
      - role: mixed
        endpoints:
          - {name: q0, address: %s}
`

type liveOpts struct {
	failClosed bool
	noAgent    bool // nothing answers on the agent address
	maxFrame   int  // SPOE max-frame-size (0 = HAProxy's default)
}

func startLive(t *testing.T, o liveOpts) *liveEnv {
	t.Helper()
	needHAProxy(t)
	e := &liveEnv{dir: t.TempDir(), listen: freeport.Addr(t), reps: map[string]*replica{}}
	for _, n := range []string{"r0", "r1", "r2", "q0"} {
		e.reps[n] = startReplica(t, n)
	}
	syslog := freeport.Addr(t)
	yaml := fmt.Sprintf(liveYAML, syslog, e.reps["r0"].addr, e.reps["r1"].addr, e.reps["r2"].addr, e.reps["q0"].addr)
	agentAddr := freeport.Addr(t)
	e.tp = startTurnout(t, yaml, agentAddr, !o.noAgent)
	d := &cfgData{
		Generator: "route/spoe live test", Dir: e.dir, Listen: e.listen, Syslog: syslog,
		DefaultBackend: "llama_mixed", Nbthread: 2, BufSize: 262144 + 16384, RouteBody: 262144, RetryOn: true,
		ServerVars: serverVars(2),
		Backends: []cfgBackend{
			{Name: "llama_mixed", Servers: []cfgServer{{Name: "r0", Addr: e.reps["r0"].addr}, {Name: "r1", Addr: e.reps["r1"].addr}, {Name: "r2", Addr: e.reps["r2"].addr}}},
			{Name: "qwen_mixed", Servers: []cfgServer{{Name: "q0", Addr: e.reps["q0"].addr}}},
		},
		SPOE: newSPOEData(e.dir, agentAddr, 2, o.failClosed),
	}
	d.SPOE.MaxFrameSize = o.maxFrame
	renderTestConfig(t, d)
	startHAProxy(t, filepath.Join(e.dir, "haproxy.cfg"), e.listen)
	if !o.noAgent {
		// The first decisions wait for the agent connection: warm it up.
		eventually(t, 5*time.Second, func() error {
			if a := post(t, e.listen, "/v1/completions", `{"model":"qwen"}`); a.replica != "q0" {
				return fmt.Errorf("warm-up landed on %q (status %d)", a.replica, a.status)
			}
			return nil
		})
	}
	return e
}

func (e *liveEnv) hits() map[string]int64 {
	out := map[string]int64{}
	for n, r := range e.reps {
		out[n] = r.hits.Load()
	}
	return out
}

func TestLiveSPOE(t *testing.T) {
	e := startLive(t, liveOpts{})
	srv := e.tp.srv

	t.Run("requests land where turnout says", func(t *testing.T) {
		v := direct(t, srv, chatBody("llama", "hi"), "X-Session-Id", "abc")
		home := string(v.Response.Header.Peek("X-Turnout-Server"))
		if home == "" {
			t.Fatalf("turnout did not route: %d %s", v.Response.StatusCode(), v.Response.Body())
		}
		for i := range 20 {
			a := post(t, e.listen, "/v1/chat/completions", chatBody("llama", fmt.Sprint("q", i)),
				"X_SESSION-id", "abc", "X-Turnout-Server", "r9") // a spoofed verdict must not matter
			if a.status != 200 || a.replica != home {
				t.Fatalf("request %d: status %d on %q, turnout's choice %q", i, a.status, a.replica, home)
			}
		}
		// Many sessions spread over the pool.
		before := e.hits()
		for i := range 60 {
			post(t, e.listen, "/v1/chat/completions", chatBody("llama", "x"), "x-session-id", fmt.Sprint("user-", i))
		}
		after := e.hits()
		for _, n := range []string{"r0", "r1", "r2"} {
			if after[n] == before[n] {
				t.Fatalf("60 sessions never reached %s: %v -> %v", n, before, after)
			}
		}
	})

	t.Run("the body's model picks the pool", func(t *testing.T) {
		for range 5 {
			if a := post(t, e.listen, "/v1/chat/completions", chatBody("qwen", "hi")); a.replica != "q0" {
				t.Fatalf("status %d on %q, want q0", a.status, a.replica)
			}
		}
	})

	t.Run("unknown model: turnout's 404 is relayed", func(t *testing.T) {
		before := e.hits()
		body := chatBody("gpt-9", "hi")
		want := direct(t, srv, body)
		a := post(t, e.listen, "/v1/chat/completions", body)
		if a.status != 404 || a.body != string(want.Response.Body()) || a.reason != "model_not_found" {
			t.Fatalf("got %d %q reason %q, want 404 %q", a.status, a.body, a.reason, want.Response.Body())
		}
		if after := e.hits(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("a refused request reached a replica: %v -> %v", before, after)
		}
	})

	t.Run("large bodies", func(t *testing.T) {
		// 200 KiB fits one buffer: one 200 KiB NOTIFY frame.
		big := `{"model":"qwen","prompt":"` + strings.Repeat("x", 200<<10) + `"}`
		if a := post(t, e.listen, "/v1/completions", big); a.status != 200 || a.replica != "q0" {
			t.Fatalf("200 KiB body: status %d on %q", a.status, a.replica)
		}
		// 400 KiB does not: turnout routes on the first buffer, marked as
		// cut, and the replica still gets the whole body.
		huge := `{"model":"qwen","prompt":"` + strings.Repeat("y", 400<<10) + `"}`
		if a := post(t, e.listen, "/v1/completions", huge); a.status != 200 || a.replica != "q0" {
			t.Fatalf("400 KiB body: status %d on %q", a.status, a.replica)
		}
		if n := e.reps["q0"].lastLen.Load(); n != int64(len(huge)) {
			t.Fatalf("replica got %d of %d bytes", n, len(huge))
		}
	})

	t.Run("feedback closes decisions", func(t *testing.T) {
		eventually(t, 5*time.Second, func() error {
			if v := metric(srv, `turnout_completions_total{result="completed"}`); v == "" || v == "0" {
				return fmt.Errorf("completed decisions %q", v)
			}
			return nil
		})
	})

	t.Run("agent down fails open quickly", func(t *testing.T) {
		e.tp.stopAgent()
		// The request that finds the agent gone waits for timeout processing
		// (HAProxy 2.6 does not wake a stream whose agent connect failed);
		// that failed connect marks the agent down (observe layer4), and from
		// then on every request fails open at once.
		var slow int
		var durs []time.Duration
		for i := range 30 {
			a := post(t, e.listen, "/v1/chat/completions", chatBody("llama", "hi"), "x-session-id", "abc")
			if a.status != 200 || a.replica == "" {
				t.Fatalf("request %d with the agent down: status %d", i, a.status)
			}
			durs = append(durs, a.dur.Round(time.Microsecond))
			// A request that waited for timeout processing (500ms) took at
			// least that long; one that failed open at once did not, however
			// busy the box (a 50ms bound here failed beside other builds).
			if a.dur > 400*time.Millisecond {
				slow++
				if a.dur > 950*time.Millisecond {
					t.Errorf("request %d took %v, over twice timeout processing (500ms)", i, a.dur)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("agent down, request latencies: %v", durs)
		if slow > 2 { // at most the first request on each HAProxy thread
			t.Errorf("%d requests waited timeout processing with the agent down", slow)
		}
		e.tp.startAgent(t)
		eventually(t, 10*time.Second, func() error {
			if a := post(t, e.listen, "/v1/completions", `{"model":"qwen"}`); a.replica != "q0" {
				return fmt.Errorf("agent back: request on %q", a.replica)
			}
			return nil
		})
	})

	t.Run("chosen server down: first fallback", func(t *testing.T) {
		v := direct(t, srv, chatBody("llama", "hi"), "X-Session-Id", "fb-user")
		home := string(v.Response.Header.Peek("X-Turnout-Server"))
		fb1, _, _ := strings.Cut(string(v.Response.Header.Peek("X-Turnout-Fallbacks")), ",")
		e.reps[home].stop()
		eventually(t, 5*time.Second, func() error {
			a := post(t, e.listen, "/v1/chat/completions", chatBody("llama", "hi"), "x-session-id", "fb-user")
			if a.replica != fb1 {
				return fmt.Errorf("with %s down: on %q (status %d), want fallback %s", home, a.replica, a.status, fb1)
			}
			return nil
		})
	})
	if s := e.tp.agent.Stats(); s.Errors != 0 {
		t.Errorf("agent stats %+v", s)
	}
}

func TestLiveSPOEFailClosed(t *testing.T) {
	e := startLive(t, liveOpts{failClosed: true, noAgent: true})
	var worst time.Duration
	slow := 0
	for i := range 10 {
		a := post(t, e.listen, "/v1/chat/completions", chatBody("llama", "hi"))
		if a.status != 503 || a.reason != "spoe-error" || !strings.Contains(a.body, `"code":"spoe-error"`) {
			t.Fatalf("request %d: %d %q reason %q, want 503 spoe-error", i, a.status, a.body, a.reason)
		}
		worst = max(worst, a.dur)
		if a.dur > 200*time.Millisecond {
			slow++
		}
	}
	t.Logf("fail-closed with no agent: slowest of 10 requests %v", worst)
	// Until its first failed connect marks the agent down (observe layer4),
	// HAProxy 2.6 holds the request that made it for timeout processing: one
	// request may wait that long (more likely when the first health check
	// has not run yet), every other must fail at once.
	if slow > 1 {
		t.Errorf("%d of 10 fail-closed requests took over 200ms (slowest %v)", slow, worst)
	}
	if n := e.hits(); n["r0"]+n["r1"]+n["r2"] != 0 {
		t.Fatalf("fail-closed requests reached replicas: %v", n)
	}
}

// With a small max-frame-size HAProxy splits a large body over several
// NOTIFY fragments (the agent announces "fragmentation") and the agent
// reassembles them.
func TestLiveSPOEFragmented(t *testing.T) {
	e := startLive(t, liveOpts{maxFrame: 16384})
	body := `{"prompt":"` + strings.Repeat("z", 100<<10) + `","model":"qwen"}` // model after 100 KiB
	for range 3 {
		if a := post(t, e.listen, "/v1/completions", body); a.status != 200 || a.replica != "q0" {
			t.Fatalf("status %d on %q, want q0", a.status, a.replica)
		}
	}
	if s := e.tp.agent.Stats(); s.Fragmented < 3 || s.Errors != 0 {
		t.Fatalf("agent stats %+v, want 3 reassembled NOTIFYs", s)
	}
}
