package httpapi

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/health"
	"github.com/turnout/turnout/route/internal/routetest"
)

func readyz(s *testServer, verbose bool) (int, string) {
	var ctx fasthttp.RequestCtx
	uri := contract.PathReadyz
	if verbose {
		uri += "?verbose"
	}
	ctx.Request.SetRequestURI(uri)
	s.Handler(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

// deadAddr is a loopback address nothing listens on.
// readyServer builds a one-pool server over addrs with health checks on.
func readyServer(t *testing.T, minReady int, addrs ...string) *testServer {
	t.Helper()
	var eps strings.Builder
	for i, a := range addrs {
		fmt.Fprintf(&eps, "          - {name: e%d, address: %q}\n", i, a)
	}
	s := mustServer(t, fmt.Sprintf(`
health: {interval: 50ms, timeout: 200ms, fails: 3, min_ready: %d}
deployments:
  - name: llama
    pools:
      - role: mixed
        endpoints:
%s`, minReady, eps.String()))
	t.Cleanup(s.Close)
	return s
}

func runHealth(t *testing.T, s *testServer) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go health.New(s.Decider).Run(ctx)
}

// waitRounds waits until at least n health rounds' worth of checks ran.
func waitRounds(t *testing.T, s *testServer, n int) {
	t.Helper()
	eps := uint64(len(s.Snapshot().Pools()[0].Endpoints))
	deadline := time.Now().Add(10 * time.Second)
	for ok, failed := s.Health().HealthChecks(); ok+failed < uint64(n)*eps || !s.Health().HealthRounded(); ok, failed = s.Health().HealthChecks() {
		if time.Now().After(deadline) {
			t.Fatal("health rounds did not run")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReadyz(t *testing.T) {
	t.Run("all endpoints down: 503 from t=0", func(t *testing.T) {
		s := readyServer(t, 1, routetest.DeadAddr(t), routetest.DeadAddr(t), routetest.DeadAddr(t), routetest.DeadAddr(t))
		if code, body := readyz(s, false); code != 503 || !strings.Contains(body, "first health round") {
			t.Fatalf("before any check: %d %q", code, body)
		}
		runHealth(t, s)
		// fails: 3, yet one failed round is enough: none was ever up.
		waitRounds(t, s, 1)
		if code, body := readyz(s, true); code != 503 || !strings.Contains(body, "pool llama_mixed: 0/4 available") {
			t.Fatalf("after a round: %d %q", code, body)
		}
	})
	t.Run("one of four up, min_ready 2: 503", func(t *testing.T) {
		s := readyServer(t, 2, routetest.LiveAddr(t), routetest.DeadAddr(t), routetest.DeadAddr(t), routetest.DeadAddr(t))
		runHealth(t, s)
		waitRounds(t, s, 2)
		if code, body := readyz(s, true); code != 503 || !strings.Contains(body, "1/4 available, min_ready 2, short") {
			t.Fatalf("%d %q", code, body)
		}
	})
	t.Run("two of four up, min_ready 2: 200", func(t *testing.T) {
		s := readyServer(t, 2, routetest.LiveAddr(t), routetest.DeadAddr(t), routetest.LiveAddr(t), routetest.DeadAddr(t))
		if code, _ := readyz(s, false); code != 503 {
			t.Fatalf("ready before the first round: %d", code)
		}
		runHealth(t, s)
		waitRounds(t, s, 1)
		if code, body := readyz(s, true); code != 200 || !strings.HasPrefix(body, "ready\npool llama_mixed: 2/4 available, min_ready 2, ok\nmodel llama: served by 4/4 of pool llama_mixed [e0 e1 e2 e3], 2 available, ok\nfeedback: ") {
			t.Fatalf("%d %q", code, body)
		}
		if code, body := readyz(s, false); code != 200 || body != "ready\n" {
			t.Fatalf("terse: %d %q", code, body)
		}
	})
}

// TestReadyzHealthDisabled: without checks nothing proves an endpoint dead
// or alive, so readiness counts the endpoints not marked down, at once.
func TestReadyzHealthDisabled(t *testing.T) {
	cfg := func(minReady int) string {
		return fmt.Sprintf(`
health: {disable: true, min_ready: %d}
deployments:
  - name: a
    pools: [{role: mixed, endpoints: [{name: a0, address: "127.0.0.1:1"}, {name: a1, address: "127.0.0.1:2"}]}]
  - name: b
    pools: [{role: mixed, min_ready: 1, endpoints: [{name: b0, address: "127.0.0.1:3"}]}]
`, minReady)
	}
	s := mustServer(t, cfg(2))
	defer s.Close()
	if code, body := readyz(s, true); code != 200 || !strings.Contains(body, "pool a_mixed: 2/2") || !strings.Contains(body, "pool b_mixed: 1/1 available, min_ready 1") {
		t.Fatalf("%d %q", code, body)
	}
	s.Snapshot().Pools()[0].Endpoints[1].SetDown(true)
	if code, body := readyz(s, false); code != 503 || !strings.Contains(body, "a_mixed has 1 available endpoints, needs 2") {
		t.Fatalf("%d %q", code, body)
	}
	for _, bad := range []string{"health: {min_ready: -1}", "health: {min_ready: 20000}"} {
		if _, err := config.ParseConfig([]byte(bad + "\ndeployments: [{name: x, pools: [{role: mixed, endpoints: [{name: a, address: \"127.0.0.1:1\"}]}]}]\n")); err == nil || !strings.Contains(err.Error(), "min_ready") {
			t.Fatalf("%s: %v", bad, err)
		}
	}
}
