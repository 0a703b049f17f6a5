package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/internal/routetest"
)

// servesModels is a replica whose GET /v1/models lists ids.
func servesModels(t *testing.T, ids ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ServedModelsPath {
			http.NotFound(w, r)
			return
		}
		items := make([]string, len(ids))
		for i, id := range ids {
			items[i] = fmt.Sprintf(`{"id":%q,"object":"model"}`, id)
		}
		fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(items, ","))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// A name no replica of its deployment serves is refused at load with its
// field path, its line, the replicas that lack it and fixes that do not
// misroute; replicas serving different names of one deployment are not
// refused (the model table routes each name to the replicas serving it).
func TestVerifyServedModels(t *testing.T) {
	const full = "meta-llama/Llama-3.1-8B-Instruct"
	plain := servesModels(t, full)
	both := servesModels(t, full, "llama")
	other := servesModels(t, "qwen") // serves none of the names: warned later, not refused
	alpha := servesModels(t, full, "alpha")
	beta := servesModels(t, full, "beta")
	dead := routetest.DeadAddr(t)
	conf := func(addrs ...string) *config.Config {
		return confModels(t, []string{full, "llama"}, addrs...)
	}
	for _, tc := range []struct {
		name   string
		models []string
		addrs  []string
		want   []string // substrings of the error; nil: accepted
	}{
		{"all serve every name", nil, []string{both, both}, nil},
		{"unreachable replica is not judged", nil, []string{dead, both}, nil},
		{"replica serving none is not judged", nil, []string{other}, nil},
		{"name served by one replica of two", nil, []string{both, plain}, nil},
		{"replicas serving different models", []string{"alpha", "beta"}, []string{servesModels(t, "alpha"), servesModels(t, "beta")}, nil},
		{"different models beside a shared one", []string{full, "alpha", "beta"}, []string{alpha, beta}, nil},
		{"alias no replica serves", nil, []string{plain, dead, plain},
			[]string{"line 4: deployments[0].models[1]", `"llama" is not served by any replica of deployment llama (r0 (` + plain + `), r2 (` + plain + `) serve`,
				"does not rewrite", "its own deployment", "add it to their --served-model-name"}},
		{"a third name nobody serves", []string{"alpha", "beta", "gamma"}, []string{alpha, beta},
			[]string{"deployments[0].models[2]", `"gamma" is not served by any replica`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := conf(tc.addrs...)
			if tc.models != nil {
				c = confModels(t, tc.models, tc.addrs...)
			}
			err := VerifyServedModels(context.Background(), c, nil)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted a model no replica serves")
			}
			if !errors.Is(err, config.ErrConfig) {
				t.Errorf("not a config error: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if n := strings.Count(err.Error(), "is not served by"); n != 1 {
				t.Errorf("%d problems for one name:\n%v", n, err)
			}
			// The fix offered never sends one model's requests to another's
			// replicas: no "start every replica with" both names.
			if strings.Contains(err.Error(), "every replica") {
				t.Errorf("hint would misroute: %v", err)
			}
		})
	}
}

// confModels is a one-deployment config over addrs serving models.
func confModels(t *testing.T, models []string, addrs ...string) *config.Config {
	t.Helper()
	var b strings.Builder
	b.WriteString("health: {disable: true}\ndeployments:\n  - name: llama\n    models: [" + strings.Join(models, ", ") + "]\n    pools:\n      - endpoints:\n")
	for i, a := range addrs {
		fmt.Fprintf(&b, "          - {name: r%d, address: %s}\n", i, a)
	}
	return routetest.MustConfig(t, b.String())
}
