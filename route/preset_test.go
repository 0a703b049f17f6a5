package route

import (
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// A policy composed in the config (a preset with a prefix scorer) through
// the whole decision path: the handler hashes the prompt for it (it wants
// prompt blocks), a repeated prompt goes where it went, the decision counts
// under the preset's name, and a warm decision allocates nothing.
func TestComposedPresetDecides(t *testing.T) {
	s := mustServer(t, `
session_headers: [x-session-id]
health: {disable: true}
presets:
  - name: prefix-queue
    stages:
      filters: [{name: load-guard}]
      scorers:
        - {name: prefix, params: {block_bytes: 64}}
        - {name: engine-queue, weight: 0.05}
deployments:
  - name: llama
    models: [llama]
    policy: {name: prefix-queue}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
          - {name: c, address: 127.0.0.1:8003}
`)
	body := body4K(3)
	decide := func() string { // one decision, completed
		ctx := do(s, body)
		id, _ := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		s.Ledger().Complete(id)
		return hdr(ctx, contract.HdrServer)
	}
	first := decide()
	if first == "" {
		t.Fatal("no server chosen")
	}
	for i := 0; i < 5; i++ {
		if got := decide(); got != first {
			t.Fatalf("repeat %d went to %s, the prompt's blocks are on %s", i, got, first)
		}
	}
	var b strings.Builder
	s.WriteMetrics(&b)
	if want := `policy="prefix-queue",outcome="affinity"} 5`; !strings.Contains(b.String(), want) {
		t.Fatalf("metrics lack %s:\n%s", want, b.String())
	}
	assertZeroAllocs(t, s, routeCtx(body4K(1), "user-1"))
}
