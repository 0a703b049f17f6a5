//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// A model alias the replicas do not serve is refused when turnout starts
// and when the config is reloaded (the previous config stays), instead of
// every request with it getting vLLM's 404. The replica is a strict mock:
// like vLLM, it answers 404 for a name outside --served-model-name.
func TestModelAliasRefused(t *testing.T) {
	rep := StartMock(t, "r0", func(c *mock.Config) {
		c.Models = []string{"llama"}
		c.StrictModels = true
	})
	conf := func(listen, models string) string {
		return fmt.Sprintf(`listen: %s
health: {disable: true}
feedback: {disable: true}
deployments:
  - name: llama
    models: [%s]
    pools:
      - endpoints:
          - {name: r0, address: %s}
`, listen, models, rep.Addr)
	}

	t.Run("AtStart", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "turnout.yaml")
		if err := os.WriteFile(path, []byte(conf(FreeAddr(t), "llama, gpt-4")), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, TurnoutBin(t), "serve", "--config", path).CombinedOutput()
		if err == nil || ctx.Err() != nil {
			t.Fatalf("turnout started with an alias its replica does not serve (err %v):\n%s", err, out)
		}
		for _, want := range []string{path, "line 6", "deployments[0].models[1]", `is not served by any replica of deployment llama (r0`, "its own deployment", "add it to their --served-model-name"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("the refusal lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("OnReload", func(t *testing.T) {
		listen := FreeAddr(t)
		tu := StartTurnout(t, listen, conf(listen, "llama"), "--watch", "50ms")
		route := func(model string) int {
			res, err := Post(context.Background(), http.DefaultClient, tu.URL+"/internal/route",
				[]byte(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			return res.Status
		}
		if st := route("llama"); st != http.StatusOK {
			t.Fatalf("served name: %d", st)
		}
		tu.Rewrite(t, conf(listen, "llama, gpt-4"))
		Eventually(t, 10*time.Second, "the reload to be rejected", func() bool {
			v, err := Metric(t, tu.URL+"/metrics", "turnout_config_reloads_total", `result="rejected"`)
			return err == nil && v >= 1
		})
		if st := route("gpt-4"); st != http.StatusNotFound {
			t.Errorf("the refused alias is routed: %d (want the previous config's 404)", st)
		}
		if st := route("llama"); st != http.StatusOK {
			t.Errorf("served name after the refused reload: %d", st)
		}
	})
}

// A deployment whose replicas serve different models (one alpha, one beta,
// both strict like vLLM) starts, and each request goes to the replica that
// serves its model: no 404, through HAProxy.
func TestMixedModelDeployment(t *testing.T) {
	strict := func(model string) func(*mock.Config) {
		return func(c *mock.Config) {
			c.Models = []string{model}
			c.StrictModels = true
		}
	}
	ra, rb := StartMock(t, "ra", strict("alpha")), StartMock(t, "rb", strict("beta"))
	s := startStackWith(t, "open", spoeDefault, depSpec{name: "mixed", models: []string{"alpha", "beta"}, policy: policyLeast, mocks: []*Mock{ra, rb}})
	Eventually(t, 20*time.Second, "both replicas' model lists polled", func() bool {
		a, err1 := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_model_missing", `endpoint="ra"`, `model="beta"`)
		b, err2 := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_model_missing", `endpoint="rb"`, `model="alpha"`)
		return err1 == nil && err2 == nil && a == 1 && b == 1
	})
	const n = 20
	for i := range n {
		model := []string{"alpha", "beta"}[i%2]
		r := s.post(t, "/v1/chat/completions", chatBody(model, "system", fmt.Sprintf("question %d", i), false), nil)
		if r.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", model, r.Status, r.Body)
		}
	}
	if a, b := ra.Stats(), rb.Stats(); a.Requests != n/2 || b.Requests != n/2 || a.Failed+b.Failed != 0 {
		t.Errorf("alpha replica got %d requests, beta replica %d (want %d each, all for their own model)", a.Requests, b.Requests, n/2)
	}
}
