package config

import (
	"errors"
	"strings"
	"testing"
)

// discovery.kubernetes.inference_pool: exclusive with service and
// label_selector, a valid object name, no port; errors name line and field.
func TestInferencePoolDiscoveryConfig(t *testing.T) {
	ok := mustParse(t, `deployments:
  - name: llama
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, inference_pool: vllm-llama.v1, role_label: r, role_values: [mixed]}}
`)
	if got := ok.Deployments[0].Pools[0].Discovery.Kubernetes.InferencePool; got != "vllm-llama.v1" {
		t.Fatalf("inference_pool = %q", got)
	}
	for _, tc := range []struct{ name, kube, field, msg string }{
		{"with service", `{service: vllm, inference_pool: p}`, "discovery.kubernetes", "set exactly one of service, label_selector and inference_pool"},
		{"with label_selector", `{label_selector: "app=vllm", inference_pool: p}`, "discovery.kubernetes", "set exactly one of"},
		{"bad name", `{inference_pool: "Vllm_Pool"}`, "discovery.kubernetes.inference_pool", "is not an InferencePool name"},
		{"port", `{inference_pool: p, port: http}`, "discovery.kubernetes.port", "targetPorts give the ports"},
		{"none", `{namespace: llm}`, "discovery.kubernetes", "set exactly one of"},
	} {
		_, err := ParseConfig([]byte("deployments:\n  - name: llama\n    pools:\n      - role: mixed\n        discovery: {kubernetes: " + tc.kube + "}\n"))
		var ce *ConfigError
		if !errors.As(err, &ce) || len(ce.Problems) != 1 {
			t.Errorf("%s: want one problem, got %v", tc.name, err)
			continue
		}
		p := ce.Problems[0]
		if p.Line != 5 || !strings.Contains(err.Error(), "deployments[0].pools[0]."+tc.field+": ") || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: want line 5, field %s, %q; got line %d: %v", tc.name, tc.field, tc.msg, p.Line, err)
		}
	}
}
