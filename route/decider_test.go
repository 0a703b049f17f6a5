package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
)

// The ledger: every decision opened is closed once, by completion or TTL
// (route/feedback closes them from proxy log lines: TestCompletionLines).
func TestCompletionAccounting(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	var ids []string
	for i := 0; i < 40; i++ {
		ids = append(ids, hdr(do(s, chatBody("llama", "", "x")), contract.HdrDecision))
	}
	total := func() (n int64) {
		for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
			n += e.Inflight()
		}
		return n
	}
	if total() != 40 {
		t.Fatalf("inflight %d, want 40", total())
	}
	for _, id := range ids {
		n, ok := contract.ParseDecisionID([]byte(id))
		if !ok || !s.Ledger().Complete(n) {
			t.Fatalf("decision %q not completed", id)
		}
	}
	if total() != 0 {
		t.Fatalf("inflight %d after completions", total())
	}
	if n, _ := contract.ParseDecisionID([]byte(ids[0])); s.Ledger().Complete(n) {
		t.Fatal("duplicate completion accepted")
	}
	if s.dec.duplicate.Load() != 1 {
		t.Fatalf("duplicates %d", s.dec.duplicate.Load())
	}
	// TTL expiry.
	do(s, chatBody("llama", "", "x"))
	s.dec.sweep(time.Now().Add(time.Hour), time.Minute, false)
	if total() != 0 || s.dec.expired.Load() != 1 {
		t.Fatalf("expiry: inflight %d expired %d", total(), s.dec.expired.Load())
	}
}

func TestConfigErrorsNameField(t *testing.T) {
	for _, tc := range []struct{ name, yaml, field string }{
		{"no deployments", `listen: 127.0.0.1:1`, "deployments"},
		{"bad listen", "listen: nope\ndeployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]", "listen"},
		{"bad endpoint name", "deployments: [{name: a, pools: [{endpoints: [{name: 'a b', address: 1.2.3.4:5}]}]}]", "deployments[0].pools[0].endpoints[0].name"},
		{"injection in name", "deployments: [{name: \"a\\nserver x\", pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]", "deployments[0].name"},
		{"bad address", "deployments: [{name: a, pools: [{endpoints: [{name: a, address: '1.2.3.4'}]}]}]", "address"},
		{"duplicate server", "deployments: [{name: a, pools: [{endpoints: [{name: x, address: 1.2.3.4:5}, {name: x, address: 1.2.3.4:6}]}]}]", "endpoints[1].name"},
		{"unknown field", "deployments: [{name: a, polcy: {}}]", "polcy"},
		{"bad role", "deployments: [{name: a, pools: [{role: gpu, endpoints: [{name: a, address: 1.2.3.4:5}]}]}]", "role"},
		{"pd needs both", "deployments: [{name: a, pools: [{role: prefill, endpoints: [{name: a, address: 1.2.3.4:5}]}]}]", "prefill and decode"},
		{"bad header", "session_headers: ['x session']\ndeployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]", "session_headers[0]"},
		{"duplicate model", "deployments: [{name: a, models: [m], pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}, {name: b, models: [m], pools: [{endpoints: [{name: b, address: 1.2.3.4:6}]}]}]", "models[0]"},
		{"bad spoe address", "haproxy: {spoe: nowhere}\ndeployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]", "haproxy.spoe"},
		{"fail mode", "proxy: {fail_mode: maybe}\ndeployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]", "proxy.fail_mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseConfig([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want mention of %q", err, tc.field)
			}
		})
	}
	// Policy params are checked at load, naming the policy.
	_, err := New(mustConfig(t, "deployments: [{name: a, policy: {name: prefix-affinity, params: {block_bytes: 1}}, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]"), Options{})
	if err == nil || !strings.Contains(err.Error(), "block_bytes") {
		t.Fatalf("bad params: %v", err)
	}
	_, err = New(mustConfig(t, "deployments: [{name: a, policy: {name: nope}, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]"), Options{})
	if err == nil || !strings.Contains(err.Error(), "unknown policy") {
		t.Fatalf("unknown policy: %v", err)
	}
	if _, err := config.ParseConfig(config.DefaultConfigYAML); err != nil {
		t.Fatalf("embedded default: %v", err)
	}
}
