package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// setServed publishes what endpoint name serves (as route/health's poll
// does) and rebuilds the model table.
func setServed(s *Decider, name string, models ...fleet.ServedModel) {
	s.Snapshot().EndpointByServer([]byte(name)).SetServed(&fleet.ServedModels{Models: models, Source: fleet.ModelsListed})
	s.RefreshModels()
}

func base(id string) fleet.ServedModel { return fleet.ServedModel{ID: id} }
func lora(id string) fleet.ServedModel { return fleet.ServedModel{ID: id, Parent: "llama"} }
func servers(s *Decider, model string, n int) (map[string]int, int, string) {
	got := map[string]int{}
	status, reason := 0, ""
	for i := 0; i < n; i++ {
		ctx := do(s, fmt.Sprintf(`{"model":%q,"prompt":"p%d"}`, model, i))
		status, reason = ctx.Response.StatusCode(), hdr(ctx, contract.HdrReason)
		if status == 200 {
			got[hdr(ctx, contract.HdrServer)]++
		}
	}
	return got, status, reason
}

// Issue 25: a request for a model goes only to the endpoints that serve
// it, under every policy (fallbacks included); a LoRA adapter is routed by
// the deployment of its parent; a name no endpoint ever served is 404, one
// whose endpoints stopped serving it 503 with Retry-After.
func TestModelRoutedOnlyWhereServed(t *testing.T) {
	for _, pol := range []string{"round-robin", "least-request", "session-hash", "prefix-affinity", "kv-aware"} {
		t.Run(pol, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(fourEndpoints, pol))
			defer s.Close()
			full := base("meta-llama/Llama-3.1-8B-Instruct")
			setServed(s, "a", base("llama"), full, lora("sql"))
			setServed(s, "b", base("llama"), full, lora("sql"), lora("chat"))
			setServed(s, "c", base("llama"), full) // lacks the adapters
			setServed(s, "d", full)                // lacks the alias
			for model, want := range map[string][]string{
				"llama":                            {"a", "b", "c"},
				"sql":                              {"a", "b"},
				"chat":                             {"b"},
				"meta-llama/Llama-3.1-8B-Instruct": {"a", "b", "c", "d"},
			} {
				got, status, _ := servers(s, model, 40)
				if status != 200 {
					t.Fatalf("%s: %d", model, status)
				}
				for srv := range got {
					if !contains(want, srv) {
						t.Errorf("%s went to %s (serves: %v): %v", model, srv, want, got)
					}
				}
				if pol == "round-robin" && len(got) != len(want) {
					t.Errorf("%s: round-robin used %v, want all of %v", model, got, want)
				}
			}
			// Fallbacks too: a retry must not land on a replica that 404s.
			ctx := do(s, `{"model":"chat","prompt":"x"}`)
			if fb := hdr(ctx, contract.HdrFallbacks); fb != "" {
				t.Errorf("chat fallbacks %q: only b serves it", fb)
			}
			if _, status, reason := servers(s, "nope", 1); status != 404 {
				t.Errorf("unknown model: %d %s, want 404", status, reason)
			}
			// An adapter with another parent is not this deployment's.
			setServed(s, "a", base("llama"), full, lora("sql"), fleet.ServedModel{ID: "mist", Parent: "mistral"})
			if _, status, _ := servers(s, "mist", 1); status != 404 {
				t.Errorf("adapter of another parent: %d, want 404", status)
			}
			// b down: chat's only endpoint: 503 model_unavailable, not a 404
			// nor another replica.
			s.Snapshot().EndpointByServer([]byte("b")).SetDown(true)
			ctx = do(s, `{"model":"chat","prompt":"x"}`)
			if ctx.Response.StatusCode() != 503 || hdr(ctx, contract.HdrReason) != contract.ReasonModelUnavailable || hdr(ctx, contract.HdrRetryAfter) == "" {
				t.Errorf("chat with b down: %d %q retry-after %q", ctx.Response.StatusCode(), hdr(ctx, contract.HdrReason), hdr(ctx, contract.HdrRetryAfter))
			}
			s.Snapshot().EndpointByServer([]byte("b")).SetDown(false)
			// b unloads chat: it was served, so 503 (it may come back).
			setServed(s, "b", base("llama"), full, lora("sql"))
			if _, status, reason := servers(s, "chat", 1); status != 503 || reason != contract.ReasonModelUnavailable {
				t.Errorf("chat unloaded everywhere: %d %s, want 503 %s", status, reason, contract.ReasonModelUnavailable)
			}
			// Loaded at runtime on c: routed there as soon as the table knows.
			setServed(s, "c", base("llama"), full, lora("chat"))
			if got, status, _ := servers(s, "chat", 5); status != 200 || got["c"] != 5 {
				t.Errorf("chat loaded on c: %d %v", status, got)
			}
		})
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// A deployment names its adapters by pattern, whatever their parent; an
// endpoint whose list names nothing of the deployment (a permissive mock)
// keeps its base models, and pinned models need no poll.
func TestModelPatternsAndPins(t *testing.T) {
	s := mustServer(t, `
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    lora: {adapters: ["team-*"]}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002, models: [llama, pinned-lora]}
          - {name: c, address: 127.0.0.1:8003}
`)
	defer s.Close()
	setServed(s, "a", base("llama"), fleet.ServedModel{ID: "team-x", Parent: "other-base"})
	setServed(s, "c", base("something-else"))
	if got, status, _ := servers(s, "team-x", 10); status != 200 || len(got) != 1 || got["a"] != 10 {
		t.Errorf("team-x: %d %v, want a only", status, got)
	}
	if got, status, _ := servers(s, "pinned-lora", 10); status != 200 || got["b"] != 10 {
		t.Errorf("pinned-lora: %d %v, want b only", status, got)
	}
	if got, _, _ := servers(s, "llama", 30); got["c"] == 0 || got["b"] == 0 {
		t.Errorf("llama: %v, want c (permissive) and b (pinned) too", got)
	}
	// /readyz?verbose says per model which endpoints serve it.
	var b strings.Builder
	s.WriteReadiness(&b, true)
	for _, want := range []string{
		"adapter team-x: served by 1/3 of pool llama_mixed [a], 1 available, ok\n",
		"adapter pinned-lora: served by 1/3 of pool llama_mixed [b], 1 available, ok\n",
		"model llama: served by 3/3 of pool llama_mixed [a b c], 3 available, ok\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("readyz lacks %q:\n%s", want, b.String())
		}
	}
}

// The request log and GET /internal/decision name the adapter a request
// asked for, and say it is one.
func TestDecisionRecordNamesAdapter(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	defer s.Close()
	setServed(s, "a", base("llama"), lora("sql"))
	ctx := do(s, `{"model":"sql","prompt":"x"}`)
	id, ok := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
	if !ok {
		t.Fatalf("no decision id: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	var r DecisionRecord
	if !s.Ledger().LookupDecision(id, time.Now(), &r) || r.Model != "sql" || !r.Adapter || r.Endpoint != "a" {
		t.Fatalf("record %+v", r)
	}
	ctx = do(s, `{"model":"llama","prompt":"x"}`)
	id, _ = contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
	if !s.Ledger().LookupDecision(id, time.Now(), &r) || r.Model != "llama" || r.Adapter {
		t.Fatalf("base model record %+v", r)
	}
}

// A prompt's blocks are keyed by the adapter that asked, as the engine's
// cache is: the same prompt matches for the same adapter and the same base
// model, not across adapters or between an adapter and its base model.
func TestPrefixKeyedByAdapter(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	defer s.Close()
	for _, name := range []string{"a", "b", "c", "d"} {
		setServed(s, name, base("llama"), lora("sql"), lora("chat"))
	}
	prompt := strings.Repeat("a long shared system prompt for every model. ", 40)
	matched := func(model string) int {
		ctx := do(s, fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, prompt))
		id, ok := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		var r DecisionRecord
		if !ok || !s.Ledger().LookupDecision(id, time.Now(), &r) {
			t.Fatalf("%s: no decision: %d %s", model, ctx.Response.StatusCode(), ctx.Response.Body())
		}
		return r.MatchedBlocks
	}
	for i, step := range []struct {
		model string
		match bool
	}{{"sql", false}, {"sql", true}, {"chat", false}, {"llama", false}, {"llama", true}, {"chat", true}} {
		if got := matched(step.model); (got > 0) != step.match {
			t.Fatalf("step %d (%s): matched %d blocks, want a match %v", i, step.model, got, step.match)
		}
	}
}
