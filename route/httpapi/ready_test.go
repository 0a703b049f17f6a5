package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// runHealth starts the health checks and the served-model poll, as
// control does.
func runHealth(t *testing.T, s *testServer) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	hc := health.New(s.Decider)
	go hc.Run(ctx)
	go hc.CheckServedModels(ctx, 0)
}

// replicaAddr is a replica answering /health and listing ids on
// /v1/models; while failModels is set its /v1/models answers 500.
func replicaAddr(t *testing.T, failModels *atomic.Bool, ids ...string) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != health.ServedModelsPath {
			return
		}
		if failModels != nil && failModels.Load() {
			w.WriteHeader(500)
			return
		}
		var items []string
		for _, id := range ids {
			items = append(items, fmt.Sprintf(`{"id":%q,"object":"model"}`, id))
		}
		fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(items, ","))
	}))
	t.Cleanup(ts.Close)
	return strings.TrimPrefix(ts.URL, "http://")
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
		s := readyServer(t, 2, replicaAddr(t, nil, "llama"), routetest.DeadAddr(t), routetest.DeadAddr(t), routetest.DeadAddr(t))
		runHealth(t, s)
		waitRounds(t, s, 2)
		waitReadyz(t, s, "1/4 available, min_ready 2, short")
		if code, body := readyz(s, true); code != 503 || !strings.Contains(body, "1/4 available, min_ready 2, short") {
			t.Fatalf("%d %q", code, body)
		}
	})
	t.Run("two of four up, min_ready 2: 200", func(t *testing.T) {
		s := readyServer(t, 2, replicaAddr(t, nil, "llama"), routetest.DeadAddr(t), replicaAddr(t, nil, "llama"), routetest.DeadAddr(t))
		if code, _ := readyz(s, false); code != 503 {
			t.Fatalf("ready before the first round: %d", code)
		}
		runHealth(t, s)
		waitRounds(t, s, 1)
		waitReadyz(t, s, "ready\n")
		if code, body := readyz(s, true); code != 200 || !strings.HasPrefix(body, "ready\npool llama_mixed: 2/4 available, min_ready 2, ok\nmodel llama: served by 4/4 of pool llama_mixed [e0 e1 e2 e3], 2 available, ok\n") ||
			!strings.Contains(body, "\nsignals pool llama_mixed (least-request): ") || !strings.Contains(body, "\nfeedback: ") {
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
	// Deployment a short of its min_ready: b still routes, so ready.
	s.Snapshot().Pools()[0].Endpoints[1].SetDown(true)
	if code, body := readyz(s, true); code != 200 || !strings.Contains(body, "pool a_mixed: 1/2 available, min_ready 2, short") ||
		!strings.Contains(body, "model a: served by 2/2 of pool a_mixed [a0 a1], 1 available, not ready: pool a_mixed has 1 available endpoints serving it, needs 2") ||
		!strings.Contains(body, "model b: served by 1/1 of pool b_mixed [b0], 1 available, ok") {
		t.Fatalf("%d %q", code, body)
	}
	s.Snapshot().Pools()[1].Endpoints[0].SetDown(true)
	if code, body := readyz(s, false); code != 503 || !strings.Contains(body, "no model is routable: model a: pool a_mixed has 1 available endpoints serving it, needs 2") {
		t.Fatalf("%d %q", code, body)
	}
	for _, bad := range []string{"health: {min_ready: -1}", "health: {min_ready: 20000}"} {
		if _, err := config.ParseConfig([]byte(bad + "\ndeployments: [{name: x, pools: [{role: mixed, endpoints: [{name: a, address: \"127.0.0.1:1\"}]}]}]\n")); err == nil || !strings.Contains(err.Error(), "min_ready") {
			t.Fatalf("%s: %v", bad, err)
		}
	}
}

// waitReadyz waits until /readyz?verbose contains want.
func waitReadyz(t *testing.T, s *testServer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := readyz(s, true)
		if strings.Contains(body, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz?verbose never said %q: %q", want, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metric returns the /metrics line that starts with prefix ("" when none).
func metric(s *testServer, prefix string) string {
	var b strings.Builder
	s.WriteMetrics(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestReadyzPerModel: one deployment whose every replica is down does not
// make turnout unready while another deployment's model routes; the
// verbose view and the metrics name the model that is down, and both
// read 0/1 from the start.
func TestReadyzPerModel(t *testing.T) {
	s := mustServer(t, `
health: {interval: 50ms, timeout: 200ms}
deployments:
  - name: a
    pools: [{role: mixed, endpoints: [{name: a0, address: "`+replicaAddr(t, nil, "a")+`"}]}]
  - name: b
    pools: [{role: mixed, endpoints: [{name: b0, address: "`+routetest.DeadAddr(t)+`"}, {name: b1, address: "`+routetest.DeadAddr(t)+`"}]}]
`)
	defer s.Close()
	for _, want := range []string{`turnout_model_ready{deployment="a",model="a"} 0`, `turnout_pool_ready{deployment="b",pool="b_mixed"} 0`} {
		if got := metric(s, strings.TrimSuffix(want, " 0")); got != want {
			t.Fatalf("before any check: %q, want %q", got, want)
		}
	}
	runHealth(t, s)
	waitReadyz(t, s, "ready\n")
	code, body := readyz(s, true)
	if code != 200 || !strings.Contains(body, "model a: served by 1/1 of pool a_mixed [a0], 1 available, ok") ||
		!strings.Contains(body, "model b: served by 2/2 of pool b_mixed [b0 b1], 0 available, not ready: pool b_mixed has 0 available endpoints serving it, needs 1") ||
		!strings.Contains(body, "pool b_mixed: 0/2 available, min_ready 1, short") {
		t.Fatalf("%d %q", code, body)
	}
	for _, want := range []string{
		`turnout_model_ready{deployment="a",model="a"} 1`, `turnout_model_ready{deployment="b",model="b"} 0`,
		`turnout_pool_ready{deployment="a",pool="a_mixed"} 1`, `turnout_pool_ready{deployment="b",pool="b_mixed"} 0`,
	} {
		if got := metric(s, want[:len(want)-2]); got != want {
			t.Errorf("metric %q, want %q", got, want)
		}
	}
}

// TestReadyzMinReadyZero: min_ready 0, under health: or on the pool, means
// the pool may be empty: ready with every replica down, after a reload
// too, and the verbose view says min_ready 0.
func TestReadyzMinReadyZero(t *testing.T) {
	cfg := func(health, pool string) string {
		return fmt.Sprintf(`
health: {interval: 50ms, timeout: 200ms%s}
deployments:
  - name: a
    pools: [{role: mixed%s, endpoints: [{name: a0, address: %q}]}]
`, health, pool, routetest.DeadAddr(t))
	}
	s := mustServer(t, cfg("", ""))
	defer s.Close()
	runHealth(t, s)
	waitRounds(t, s, 1)
	if code, body := readyz(s, true); code != 503 || !strings.Contains(body, "pool a_mixed: 0/1 available, min_ready 1, short") {
		t.Fatalf("default min_ready: %d %q", code, body)
	}
	for _, c := range []struct{ name, health, pool string }{
		{"health", ", min_ready: 0", ""},
		{"pool", ", min_ready: 3", ", min_ready: 0"},
	} {
		if err := s.Apply(routetest.MustConfig(t, cfg(c.health, c.pool))); err != nil {
			t.Fatal(err)
		}
		if code, body := readyz(s, true); code != 200 || !strings.Contains(body, "pool a_mixed: 0/1 available, min_ready 0, ok") ||
			!strings.Contains(body, "model a: served by 1/1 of pool a_mixed [a0], 0 available, ok") {
			t.Fatalf("%s min_ready 0 after a reload: %d %q", c.name, code, body)
		}
		if got := metric(s, `turnout_pool_ready{deployment="a",pool="a_mixed"}`); !strings.HasSuffix(got, " 1") {
			t.Errorf("%s: %q", c.name, got)
		}
	}
}

// TestReadyzWaitsForModelList: an endpoint that passed its health check
// but whose GET /v1/models fails is waited for (503, named) until its list
// arrives, re-polled within a second, not after models_interval (10m
// here); with a list that never comes, readiness stops waiting after
// health.models_wait.
func TestReadyzWaitsForModelList(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	s := mustServer(t, `
health: {interval: 50ms, timeout: 200ms, models_interval: 10m}
deployments:
  - name: llama
    pools: [{role: mixed, endpoints: [{name: e0, address: "`+replicaAddr(t, &fail, "llama", "sql")+`"}]}]
`)
	defer s.Close()
	runHealth(t, s)
	waitReadyz(t, s, "endpoint e0: up ")
	if code, body := readyz(s, true); code != 503 || !strings.Contains(body, "waiting for the model list (GET /v1/models) of 1 endpoint(s), first e0") {
		t.Fatalf("list pending: %d %q", code, body)
	}
	fail.Store(false)
	start := time.Now()
	waitReadyz(t, s, "ready\n")
	t.Logf("ready %v after the list could be read", time.Since(start))
	if code, body := readyz(s, true); code != 200 || !strings.Contains(body, "model llama: served by 1/1 of pool llama_mixed [e0], 1 available, ok") {
		t.Fatalf("%d %q", code, body)
	}

	// A list that never comes: ready once models_wait is over.
	s2 := mustServer(t, `
health: {interval: 50ms, timeout: 200ms, models_interval: 10m, models_wait: 500ms}
deployments:
  - name: llama
    pools: [{role: mixed, endpoints: [{name: e0, address: "`+routetest.LiveAddr(t)+`"}]}]
`)
	defer s2.Close()
	runHealth(t, s2)
	waitReadyz(t, s2, "endpoint e0: up ")
	waitReadyz(t, s2, "ready\n")
	if code, body := readyz(s2, true); code != 200 || strings.Contains(body, "endpoint e0: up") {
		t.Fatalf("after models_wait: %d %q", code, body)
	}
}
