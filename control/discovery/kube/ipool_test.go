package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/lab/testenv/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const ipoolPools = `
deployments:
  - name: chat
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, inference_pool: chat}}
  - name: pd
    pools:
      - role: prefill
        discovery: {kubernetes: {namespace: llm, inference_pool: pd, role_label: vllm-role}}
      - role: decode
        discovery: {kubernetes: {namespace: llm, inference_pool: pd, role_label: vllm-role}}
`

// must fails the test on err.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// poolIs waits until pool's endpoints read want (names() form).
func poolIs(t *testing.T, s *Source, pool, want string) {
	t.Helper()
	waitFor(t, s, pool+" = "+want, func(m map[string][]config.EndpointConfig) bool {
		eps, ok := m[pool]
		return ok && names(eps) == want
	})
}

// waitVanished waits until the pool's vanished state is want.
func waitVanished(t *testing.T, s *Source, pool string, want bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Vanished()[pool] != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s vanished = %v, want %v (endpoints %v)", pool, !want, want, s.Endpoints())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestInferencePoolSource follows InferencePools on a real kube-apiserver
// with turnout's Role plus the chart's inferencepools rule: the CRD absent
// then installed, two target ports (two endpoints per pod), readiness,
// selector changes, pods relabelled out of and into the selector, a pod
// terminating then deleted, the pool deleted and re-created, prefill and
// decode pools split by role label.
func TestInferencePoolSource(t *testing.T) {
	c := kubetest.Start(t, "../../..", ns, "")
	c.GrantInferencePools()
	s, _ := startSource(t, c.RESTConfig(kubetest.TurnoutToken), kubeCfg(t, ipoolPools))

	// No CRD: the pools are known and empty, marked vanished, and Synced
	// does not wait for them (the rest of the fleet reaches the proxies).
	poolIs(t, s, "chat_mixed", "")
	if !s.Synced() {
		t.Error("not synced with the InferencePool CRD missing")
	}
	waitVanished(t, s, "chat_mixed", true)
	if err := s.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "InferencePool CRD") {
		t.Errorf("Probe without the CRD: want a clear error, got %v", err)
	}

	c.InstallInferencePoolCRD("../../..")
	checkCRDSchema(t, c)
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	must(t, c.PutPod("c-0", app("chat"), "10.244.0.10", true))
	must(t, c.PutPod("c-1", app("chat"), "10.244.0.11", true))
	must(t, c.PutPod("c-2", app("chat"), "10.244.0.12", false)) // not ready: absent
	must(t, c.PutPod("c-3", app("chat"), "", true))             // no address yet: absent
	must(t, c.PutInferencePool("chat", app("chat"), 8000, 8001))
	poolIs(t, s, "chat_mixed", "c-0_rank0=10.244.0.10:8000 c-0_rank1=10.244.0.10:8001 c-1_rank0=10.244.0.11:8000 c-1_rank1=10.244.0.11:8001")
	waitVanished(t, s, "chat_mixed", false)

	// Readiness flips both ranks of a pod.
	must(t, c.PutPod("c-2", app("chat"), "10.244.0.12", true))
	must(t, c.PutPod("c-1", app("chat"), "10.244.0.11", false))
	poolIs(t, s, "chat_mixed", "c-0_rank0=10.244.0.10:8000 c-0_rank1=10.244.0.10:8001 c-2_rank0=10.244.0.12:8000 c-2_rank1=10.244.0.12:8001")

	// The selector changes: the pool follows the new pods only.
	must(t, c.PutPod("n-0", app("chat-v2"), "10.244.0.20", true))
	must(t, c.PutInferencePool("chat", app("chat-v2"), 8000, 8001))
	poolIs(t, s, "chat_mixed", "n-0_rank0=10.244.0.20:8000 n-0_rank1=10.244.0.20:8001")

	// One target port: endpoints are named after their pods.
	must(t, c.PutInferencePool("chat", app("chat-v2"), 9000))
	poolIs(t, s, "chat_mixed", "n-0=10.244.0.20:9000")

	// Pods relabelled into and out of the selector.
	must(t, c.PutPod("c-0", app("chat-v2"), "10.244.0.10", true))
	poolIs(t, s, "chat_mixed", "c-0=10.244.0.10:9000 n-0=10.244.0.20:9000")
	must(t, c.PutPod("n-0", app("other"), "10.244.0.20", true))
	poolIs(t, s, "chat_mixed", "c-0=10.244.0.10:9000")

	// A pod deleted: terminating (still Ready) drains, then it is gone,
	// and with it every pod of the pool: vanished, not merely empty.
	must(t, c.DeletePod("c-0"))
	poolIs(t, s, "chat_mixed", "c-0=10.244.0.10:9000(draining)")
	waitVanished(t, s, "chat_mixed", false)
	must(t, c.ForceDeletePod("c-0"))
	poolIs(t, s, "chat_mixed", "")
	waitVanished(t, s, "chat_mixed", true)

	// The pool deleted and re-created.
	must(t, c.PutPod("n-0", app("chat-v2"), "10.244.0.20", true))
	poolIs(t, s, "chat_mixed", "n-0=10.244.0.20:9000")
	must(t, c.DeleteInferencePool("chat"))
	poolIs(t, s, "chat_mixed", "")
	waitVanished(t, s, "chat_mixed", true)
	must(t, c.PutInferencePool("chat", app("chat-v2"), 9000))
	poolIs(t, s, "chat_mixed", "n-0=10.244.0.20:9000")
	waitVanished(t, s, "chat_mixed", false)

	// Prefill and decode from one InferencePool, by role label.
	pd := func(role string) map[string]string { return map[string]string{"app": "pd", "vllm-role": role} }
	must(t, c.PutPod("p-0", pd("prefill"), "10.244.0.30", true))
	must(t, c.PutPod("d-0", pd("decode"), "10.244.0.31", true))
	must(t, c.PutPod("x-0", pd("other"), "10.244.0.32", true))
	must(t, c.PutInferencePool("pd", map[string]string{"app": "pd"}, 8000))
	poolIs(t, s, "pd_prefill", "p-0=10.244.0.30:8000")
	poolIs(t, s, "pd_decode", "d-0=10.244.0.31:8000")
	if !s.Synced() {
		t.Error("not synced at the end")
	}
}

// checkCRDSchema: the CRD refuses what the published API refuses.
func checkCRDSchema(t *testing.T, c *kubetest.Cluster) {
	t.Helper()
	api := c.Dynamic().Resource(kubetest.InferencePoolGVR).Namespace(ns)
	ok := c.InferencePool("schema-ok", map[string]string{"app": "x"}, 8000, 8001, 8002, 8003, 8004, 8005, 8006, 8007)
	if _, err := api.Create(context.Background(), ok, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("8 target ports refused: %v", err)
	}
	for what, edit := range map[string]func(o map[string]any){
		"9 target ports": func(o map[string]any) {
			var tp []any
			for p := range 9 {
				tp = append(tp, map[string]any{"number": int64(8000 + p)})
			}
			o["spec"].(map[string]any)["targetPorts"] = tp
		},
		"no target port": func(o map[string]any) { o["spec"].(map[string]any)["targetPorts"] = []any{} },
		"port 0": func(o map[string]any) {
			o["spec"].(map[string]any)["targetPorts"] = []any{map[string]any{"number": int64(0)}}
		},
		"port listed twice": func(o map[string]any) {
			o["spec"].(map[string]any)["targetPorts"] = []any{map[string]any{"number": int64(1)}, map[string]any{"number": int64(1)}}
		},
		"bad failureMode": func(o map[string]any) {
			o["spec"].(map[string]any)["endpointPickerRef"].(map[string]any)["failureMode"] = "Sometimes"
		},
		"Service picker without port": func(o map[string]any) {
			delete(o["spec"].(map[string]any)["endpointPickerRef"].(map[string]any), "port")
		},
		"no selector":          func(o map[string]any) { delete(o["spec"].(map[string]any), "selector") },
		"no endpointPickerRef": func(o map[string]any) { delete(o["spec"].(map[string]any), "endpointPickerRef") },
	} {
		o := c.InferencePool("schema-bad", map[string]string{"app": "x"}, 8000)
		edit(o.Object)
		if _, err := api.Create(context.Background(), o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
			t.Errorf("the CRD accepts an InferencePool with %s", what)
		}
	}
}

func TestRankNames(t *testing.T) {
	long := strings.Repeat("v", 70)
	seen := map[string]bool{}
	for _, pod := range []string{"vllm-0", long, long + "x"} {
		for rank := range 8 {
			n := rankName(ns, pod, rank, 8)
			if !config.ValidName(n) || n != rankName(ns, pod, rank, 8) || seen[n] {
				t.Errorf("%s rank %d -> %q: must be valid, stable and unique", pod, rank, n)
			}
			seen[n] = true
			if !strings.HasSuffix(n, "_rank"+string(rune('0'+rank))) {
				t.Errorf("%q does not show rank %d", n, rank)
			}
		}
	}
	if n := rankName(ns, "vllm-0", 0, 1); n != "vllm-0" {
		t.Errorf("one target port: %q, want the pod's name", n)
	}
}

func TestInferencePoolValidate(t *testing.T) {
	for _, tc := range []struct {
		ip   inferencePool
		want string
	}{
		{inferencePool{Selector: map[string]string{"app": "x"}, Ports: []int{8000, 8001}}, ""},
		{inferencePool{Selector: map[string]string{"app": "x"}}, "targetPorts is empty"},
		{inferencePool{Selector: map[string]string{}, Ports: []int{8000}}, "selects no pod"},
		{inferencePool{Selector: map[string]string{"app": "x"}, Ports: []int{8000, 8000}}, "listed twice"},
		{inferencePool{Selector: map[string]string{"app": "x"}, Ports: []int{70000}}, "out of range"},
		{inferencePool{Selector: map[string]string{"app": "x"}, Ports: []int{1, 2, 3, 4, 5, 6, 7, 8, 9}}, "at most 8"},
		{inferencePool{Selector: map[string]string{"bad key!": "x"}, Ports: []int{1}}, "matchLabels key"},
	} {
		got := tc.ip.validate()
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%+v: %q, want %q", tc.ip, got, tc.want)
		}
	}
}
