package health

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/internal/routetest"
)

// A replica whose /v1/models lacks one of the deployment's model names is
// named, with the vLLM flag that fixes it, in the log and in /metrics; a
// replica serving every name is not.
func TestServedModelsCheck(t *testing.T) {
	served := func(ids ...string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != ServedModelsPath {
				http.NotFound(w, r)
				return
			}
			var items []string
			for _, id := range ids {
				items = append(items, fmt.Sprintf(`{"id":%q,"object":"model"}`, id))
			}
			fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(items, ","))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	const full = "meta-llama/Llama-3.1-8B-Instruct"
	a := served(full)          // started without the alias
	b := served(full, "llama") // --served-model-name meta-llama/Llama-3.1-8B-Instruct llama
	cfg := routetest.MustConfig(t, fmt.Sprintf(`health: {disable: true}
deployments:
  - name: llama
    models: [%s, llama]
    pools:
      - endpoints:
          - {name: a, address: %s}
          - {name: b, address: %s}
`, full, strings.TrimPrefix(a.URL, "http://"), strings.TrimPrefix(b.URL, "http://")))
	var logs bytes.Buffer
	log := zerolog.New(&logs)
	s, err := route.New(cfg, route.Options{Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go New(s).CheckServedModels(ctx, 50*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	var m strings.Builder
	for {
		m.Reset()
		s.WriteMetrics(&m)
		if strings.Contains(m.String(), `turnout_endpoint_model_missing{endpoint="a",model="llama"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no missing-model metric for a:\n%s", m.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(m.String(), `turnout_endpoint_model_missing{endpoint="b"`) {
		t.Errorf("b serves every name but is reported:\n%s", m.String())
	}
	out := logs.String()
	if !strings.Contains(out, `endpoint a does not serve \"llama\"`) || !strings.Contains(out, "add it to its --served-model-name") || strings.Contains(out, "--served-model-name "+full+" llama") {
		t.Errorf("warning does not name the endpoint, the alias and a fix that cannot misroute:\n%s", out)
	}
	if strings.Contains(out, "endpoint b ") {
		t.Errorf("warned about b:\n%s", out)
	}
}

// flakyReplica answers /health while healthy is set (else 503) and lists
// ids on /v1/models once listable is set (else 500); it counts the
// /v1/models calls.
func flakyReplica(t *testing.T, healthy, listable *atomic.Bool, calls *atomic.Int64, ids ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			if !healthy.Load() {
				w.WriteHeader(503)
			}
		case ServedModelsPath:
			calls.Add(1)
			if !listable.Load() {
				w.WriteHeader(500)
				return
			}
			var items []string
			for _, id := range ids {
				items = append(items, fmt.Sprintf(`{"id":%q,"object":"model","parent":"llama"}`, id))
			}
			fmt.Fprintf(w, `{"object":"list","data":[{"id":"llama","object":"model"},%s]}`, strings.Join(items, ","))
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// waitListed waits until endpoint e0 lists adapter id, failing after
// bound; it returns how long that took.
func waitListed(t *testing.T, s *route.Decider, id string, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		e := s.Snapshot().EndpointByServer([]byte("e0"))
		if sm := e.ServedModels(); sm != nil && sm.Serves(id) {
			return time.Since(start)
		}
		if time.Since(start) > bound {
			t.Fatalf("e0's list still lacks %s after %v (models_interval is 10m: only a re-poll finds it)", id, bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pollServer(t *testing.T, addr string) *route.Decider {
	t.Helper()
	cfg := routetest.MustConfig(t, fmt.Sprintf(`health: {interval: 50ms, timeout: 300ms, models_interval: 10m}
deployments:
  - name: llama
    pools: [{role: mixed, endpoints: [{name: e0, address: %s}]}]
`, addr))
	s, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := New(s)
	go c.Run(ctx)
	go c.CheckServedModels(ctx, 0)
	return s
}

// A healthy endpoint whose /v1/models fails is asked again after a short
// backoff, not after models_interval.
func TestModelsRepolledAfterFailure(t *testing.T) {
	var healthy, listable atomic.Bool
	var calls atomic.Int64
	healthy.Store(true)
	s := pollServer(t, flakyReplica(t, &healthy, &listable, &calls, "sql"))
	for deadline := time.Now().Add(10 * time.Second); calls.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/v1/models asked %d times in 10 s while failing", calls.Load())
		}
	}
	listable.Store(true)
	took := waitListed(t, s, "sql", 10*time.Second)
	t.Logf("listed %v after /v1/models answered (%d calls)", took, calls.Load())
}

// An endpoint down at the first poll is polled as soon as a health check
// finds it up.
func TestModelsPolledWhenEndpointComesUp(t *testing.T) {
	var healthy, listable atomic.Bool
	var calls atomic.Int64
	s := pollServer(t, flakyReplica(t, &healthy, &listable, &calls, "sql"))
	for deadline := time.Now().Add(10 * time.Second); calls.Load() < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no first poll")
		}
	}
	// Let the first poll fail while the endpoint is down: the next
	// scheduled one is models_interval (10m) away.
	time.Sleep(100 * time.Millisecond)
	listable.Store(true)
	healthy.Store(true)
	took := waitListed(t, s, "sql", 10*time.Second)
	t.Logf("listed %v after it came up", took)
}

func TestRepollAfter(t *testing.T) {
	for _, c := range []struct {
		fails int
		every time.Duration
		want  time.Duration
	}{
		{1, 10 * time.Second, repollFirst},
		{2, 10 * time.Second, 2 * repollFirst},
		{4, 10 * time.Second, 8 * repollFirst},
		{40, 10 * time.Second, repollMax},
		{40, time.Second, time.Second},
		{1, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := repollAfter(c.fails, c.every); got != c.want {
			t.Errorf("repollAfter(%d, %v) = %v, want %v", c.fails, c.every, got, c.want)
		}
	}
}
