//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/turnout/turnout/lab/testenv/kubetest"
)

// Issue 25: pools take their pods by model label, as vLLM production-stack
// selects them (one Service, pods labelled with the model they serve and,
// for prefill/decode, their role), against the real kube-apiserver: each
// deployment's requests go only to pods serving its model, a label value
// maps to a model name labels cannot spell, and a relabelled pod moves.
func TestKubeModelLabels(t *testing.T) {
	kubetest.Binaries(t)
	c := kubetest.Start(t, repoRoot(), "llm", "")
	ctx := context.Background()
	pods := []struct{ name, ip, model, role string }{
		{"l-0", "10.244.0.10", "llama-8b", "mixed"},
		{"l-1", "10.244.0.11", "llama-8b", "mixed"},
		{"m-0", "10.244.0.12", "mistral", "mixed"},
		{"x-0", "10.244.0.13", "", "mixed"}, // no model label: in no pool
		{"p-0", "10.244.0.20", "llama-pd", "prefill"},
		{"d-0", "10.244.0.21", "llama-pd", "decode"},
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-a", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: kptr("http"), Port: kptr(int32(8000))}},
	}
	for _, p := range pods {
		lbl := map[string]string{"role": p.role}
		if p.model != "" {
			lbl["model"] = p.model
		}
		if _, err := c.Admin.CoreV1().Pods("llm").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: lbl},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "v", Image: "vllm"}}, AutomountServiceAccountToken: kptr(false)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		es.Endpoints = append(es.Endpoints, kubeEP(p.name, p.ip, true, false))
	}
	putSlice(t, c, es)

	addr := FreeAddr(t)
	disc := `{kubernetes: {namespace: llm, service: vllm, port: http, role_label: role, model_label: model%s}}`
	tu := StartTurnout(t, addr, fmt.Sprintf(`listen: %s
health: {disable: true}
feedback: {disable: true}
engine_metrics: {disable: true}
deployments:
  - name: llama
    models: [meta-llama/Llama-3.1-8B-Instruct]
    pools:
      - role: mixed
        discovery: %s
  - name: mistral
    models: [mistral]
    pools:
      - role: mixed
        discovery: %s
  - name: pd
    models: [llama-pd]
    pools:
      - role: prefill
        discovery: %s
      - role: decode
        discovery: %s
`, addr, fmt.Sprintf(disc, ", model_values: {llama-8b: meta-llama/Llama-3.1-8B-Instruct}"), fmt.Sprintf(disc, ""), fmt.Sprintf(disc, ""), fmt.Sprintf(disc, "")),
		"--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken))
	servers := func(model string, n int) map[string]int {
		got := map[string]int{}
		for i := range n {
			r, err := Post(ctx, http.DefaultClient, tu.URL+"/internal/route", []byte(fmt.Sprintf(`{"model":%q,"prompt":"p%d"}`, model, i)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != 200 {
				got[fmt.Sprint(r.Status)]++
				continue
			}
			got[r.Header.Get("X-Turnout-Server")]++
		}
		return got
	}
	Eventually(t, 30*time.Second, "the pools to be discovered", func() bool {
		b := readyzVerbose(t, tu)
		return strings.Contains(b, "pool llama_mixed: 2/2") && strings.Contains(b, "pool mistral_mixed: 1/1") &&
			strings.Contains(b, "pool pd_prefill: 1/1") && strings.Contains(b, "pool pd_decode: 1/1")
	})
	if got := servers("meta-llama/Llama-3.1-8B-Instruct", 20); got["l-0"]+got["l-1"] != 20 || got["l-0"] == 0 || got["l-1"] == 0 {
		t.Errorf("llama went to %v, want l-0 and l-1 only", got)
	}
	if got := servers("mistral", 10); got["m-0"] != 10 {
		t.Errorf("mistral went to %v, want m-0 only", got)
	}
	b := readyzVerbose(t, tu)
	for _, want := range []string{"model meta-llama/Llama-3.1-8B-Instruct: served by 2/2 of pool llama_mixed [l-0 l-1]", "model llama-pd: served by 1/1 of pool pd_decode [d-0]"} {
		if !strings.Contains(b, want) {
			t.Errorf("readyz lacks %q:\n%s", want, b)
		}
	}

	// m-0 is relabelled to llama: it leaves the mistral pool and joins llama's.
	p, err := c.Admin.CoreV1().Pods("llm").Get(ctx, "m-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["model"] = "llama-8b"
	if _, err := c.Admin.CoreV1().Pods("llm").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "m-0 to move to the llama pool", func() bool {
		b := readyzVerbose(t, tu)
		return strings.Contains(b, "pool llama_mixed: 3/3") && strings.Contains(b, "pool mistral_mixed: 0/0")
	})
	if got := servers("meta-llama/Llama-3.1-8B-Instruct", 30); got["m-0"] == 0 || got["l-0"]+got["l-1"]+got["m-0"] != 30 {
		t.Errorf("llama after the relabel went to %v, want m-0 among l-0, l-1", got)
	}
	if got := servers("mistral", 1); got["503"] != 1 {
		t.Errorf("mistral without pods: %v, want 503", got)
	}
}
