package route

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
)

// fakeLoRA is a replica's runtime LoRA API as vLLM answers it.
type fakeLoRA struct {
	mu       sync.Mutex
	loaded   map[string]string
	unloaded []string
	srv      *httptest.Server
}

func newFakeLoRA(t *testing.T) *fakeLoRA {
	f := &fakeLoRA{loaded: map[string]string{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ LoRAName, LoRAPath string }
		var raw map[string]string
		_ = json.NewDecoder(r.Body).Decode(&raw)
		req.LoRAName, req.LoRAPath = raw["lora_name"], raw["lora_path"]
		f.mu.Lock()
		defer f.mu.Unlock()
		switch r.URL.Path {
		case "/v1/load_lora_adapter":
			if _, ok := f.loaded[req.LoRAName]; ok {
				http.Error(w, "The lora adapter '"+req.LoRAName+"' has already been loaded.", 400)
				return
			}
			f.loaded[req.LoRAName] = req.LoRAPath
		case "/v1/unload_lora_adapter":
			delete(f.loaded, req.LoRAName)
			f.unloaded = append(f.unloaded, req.LoRAName)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// Issue 25, lora.load_on_demand: a claimed adapter no endpoint serves is
// loaded on the endpoint the policy picks before turnout answers, then
// routed there; past max_loaded the least recently routed adapter this
// way is unloaded; a name the deployment does not claim stays 404; all of
// it counted in /metrics.
func TestLoRALoadOnDemand(t *testing.T) {
	a := newFakeLoRA(t)
	s := mustServer(t, fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: lora-affinity}
    lora: {load_on_demand: true, adapters: ["team-*"], allow: [team-x, team-y], adapter_paths: {sql: /adapters/sql}, max_loaded: 2, load_timeout: 2s}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: %s}
`, strings.TrimPrefix(a.srv.URL, "http://")))
	defer s.Close()
	for _, m := range []string{"sql", "team-x", "sql", "team-y"} {
		ctx := do(s, `{"model":"`+m+`","prompt":"x"}`)
		if ctx.Response.StatusCode() != 200 || hdr(ctx, contract.HdrServer) != "a" {
			t.Fatalf("%s: %d %s", m, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
	a.mu.Lock()
	path := a.loaded["sql"]
	a.mu.Unlock()
	if path != "/adapters/sql" {
		t.Fatalf("sql loaded with path %q", path)
	}
	// sql, team-x loaded; sql routed again; team-y makes three: team-x,
	// the least recently routed, is unloaded.
	deadline := 200
	for ; deadline > 0; deadline-- {
		a.mu.Lock()
		n := len(a.unloaded)
		a.mu.Unlock()
		if n > 0 {
			break
		}
		ctxSleep()
	}
	a.mu.Lock()
	unloaded := strings.Join(a.unloaded, ",")
	a.mu.Unlock()
	if unloaded != "team-x" {
		t.Fatalf("unloaded %q, want team-x", unloaded)
	}
	if ctx := do(s, `{"model":"other","prompt":"x"}`); ctx.Response.StatusCode() != 404 {
		t.Fatalf("unclaimed adapter: %d", ctx.Response.StatusCode())
	}
	var b strings.Builder
	s.WriteMetrics(&b)
	for _, want := range []string{
		`turnout_lora_loads_total{deployment="llama",model="sql",result="ok"} 1`,
		`turnout_lora_loads_total{deployment="llama",model="team-y",result="ok"} 1`,
		`turnout_lora_unloads_total{deployment="llama",model="team-x",kind="adapter"} 1`,
		`turnout_model_decisions_total{deployment="llama",model="sql",kind="adapter"} 2`,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// Client-chosen adapter names: 1,000 names matching the deployment's
// pattern load nothing without an explicit list (lora.allow,
// adapter_paths), are 404 like any unknown name, and get no metric series
// of their own; with lora.load_patterns they load at most
// lora.max_loads_per_minute's burst at once, the rest counted as limited.
func TestLoRALoadOnDemandClientNames(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lora     string
		maxLoads int
	}{
		{"no list", `{load_on_demand: true, adapters: ["team-*"], allow: [sql]}`, 0},
		{"patterns, rate bounded", `{load_on_demand: true, adapters: ["team-*"], load_patterns: true, max_loads_per_minute: 60}`, 6 + 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeLoRA(t)
			s := mustServer(t, fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    lora: %s
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: %s}
`, tc.lora, strings.TrimPrefix(a.srv.URL, "http://")))
			defer s.Close()
			start := time.Now()
			ok := 0
			for i := range 1000 {
				ctx := do(s, fmt.Sprintf(`{"model":"team-%d","prompt":"x"}`, i))
				switch ctx.Response.StatusCode() {
				case 200:
					ok++
				case 404:
				default:
					t.Fatalf("team-%d: %d %s", i, ctx.Response.StatusCode(), ctx.Response.Body())
				}
			}
			a.mu.Lock()
			loads := len(a.loaded)
			a.mu.Unlock()
			// The rate's refill while the requests ran (1/s at 60 a minute).
			bound := tc.maxLoads
			if bound > 0 {
				bound += int(time.Since(start).Seconds())
			}
			t.Logf("%d loads, %d routed in %v", loads, ok, time.Since(start))
			if loads > bound || ok != loads {
				t.Fatalf("%d loads (%d routed) for 1,000 client names, want at most %d", loads, ok, bound)
			}
			var b strings.Builder
			s.WriteMetrics(&b)
			series := strings.Count(b.String(), `model="team-`)
			if series > 6*loads { // a loaded name's own rows: decisions, refused, cold, loads ok/failed, unloads
				t.Errorf("%d metric series name client-chosen adapters, %d loaded", series, loads)
			}
			if tc.maxLoads > 0 && !strings.Contains(b.String(), `turnout_lora_loads_limited_total{deployment="llama"} `) {
				t.Error("the limited loads are not counted")
			}
		})
	}
}

func ctxSleep() { <-time.After(10 * time.Millisecond) }

// An adapter whose only holder is unavailable (down, draining, stalled) is
// loaded on another endpoint rather than refused with 503 until the holder
// is back (found by the issue-42 soak: a stalled holder is out for
// health.stall.readmit, 30 s by default).
func TestLoRALoadOnDemandHolderUnavailable(t *testing.T) {
	a, b := newFakeLoRA(t), newFakeLoRA(t)
	s := mustServer(t, fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: least-request}
    lora: {load_on_demand: true, allow: [sql], load_timeout: 2s}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: %s}
          - {name: b, address: %s}
`, strings.TrimPrefix(a.srv.URL, "http://"), strings.TrimPrefix(b.srv.URL, "http://")))
	defer s.Close()
	ctx := do(s, `{"model":"sql","prompt":"x"}`)
	holder := hdr(ctx, contract.HdrServer)
	if ctx.Response.StatusCode() != 200 || holder == "" {
		t.Fatalf("sql: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	other := map[string]string{"a": "b", "b": "a"}[holder]
	s.Snapshot().EndpointByServer([]byte(holder)).SetDown(true)
	for range 3 {
		ctx = do(s, `{"model":"sql","prompt":"x"}`)
		if ctx.Response.StatusCode() != 200 || hdr(ctx, contract.HdrServer) != other {
			t.Fatalf("sql with its holder %s down: %d to %q %s, want %s (loaded there)", holder, ctx.Response.StatusCode(), hdr(ctx, contract.HdrServer), ctx.Response.Body(), other)
		}
	}
	var m strings.Builder
	s.WriteMetrics(&m)
	if want := `turnout_lora_loads_total{deployment="llama",model="sql",result="ok"} 2`; !strings.Contains(m.String(), want) {
		t.Errorf("metrics lack %s", want)
	}
}
