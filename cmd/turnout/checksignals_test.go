package main

import (
	"slices"
	"strings"
	"testing"
)

// turnout check warns, at the policy's field and line, about a signal the
// policy reads that nothing configured feeds, and says what would feed it;
// the same config with the producer on has no such warning.
func TestCheckWarnsUnfedSignal(t *testing.T) {
	const cfg = `
deployments:
  - name: kv
    models: [kv]
    policy: {name: kv-aware}
    pools: [{endpoints: [{name: k0, address: "127.0.0.1:1"%s}]}]
`
	err, evs := checkRun(t, strings.Replace(cfg, "%s", "", 1), "-")
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	ws := warnings(evs)["deployments[0].policy"]
	if !slices.ContainsFunc(ws, func(p string) bool {
		return strings.Contains(p, "policy kv-aware of pool kv_mixed reads the signal kv_events") && strings.Contains(p, "kv_events_bind")
	}) {
		t.Errorf("no kv_events warning at deployments[0].policy: %q", warnings(evs))
	}
	for _, ev := range evs {
		if ev["message"] == "config warning" && ev["field"] == "deployments[0].policy" && ev["line"] != float64(5) {
			t.Errorf("warning %v: want line 5 (the policy)", ev)
		}
	}
	err, evs = checkRun(t, strings.Replace(cfg, "%s", `, kv_events: "tcp://127.0.0.1:5557"`, 1), "-")
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if ws := warnings(evs)["deployments[0].policy"]; len(ws) > 0 {
		t.Errorf("kv-aware with KV events: warnings %q", ws)
	}
}
