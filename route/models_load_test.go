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
    lora: {load_on_demand: true, adapters: ["team-*"], adapter_paths: {sql: /adapters/sql}, max_loaded: 2, load_timeout: 2s}
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

func ctxSleep() { <-time.After(10 * time.Millisecond) }
