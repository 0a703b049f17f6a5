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

// An alias a replica does not serve is refused at load with its field path,
// its line, the replicas that lack it and the vLLM flag that fixes it.
func TestVerifyServedModels(t *testing.T) {
	const full = "meta-llama/Llama-3.1-8B-Instruct"
	plain := servesModels(t, full)
	both := servesModels(t, full, "llama")
	other := servesModels(t, "qwen") // serves none of the names: warned later, not refused
	dead := routetest.DeadAddr(t)
	conf := func(addrs ...string) *config.Config {
		var b strings.Builder
		b.WriteString("health: {disable: true}\ndeployments:\n  - name: llama\n    models: [" + full + ", llama]\n    pools:\n      - endpoints:\n")
		for i, a := range addrs {
			fmt.Fprintf(&b, "          - {name: r%d, address: %s}\n", i, a)
		}
		return routetest.MustConfig(t, b.String())
	}
	for _, tc := range []struct {
		name  string
		addrs []string
		want  []string // substrings of the error; nil: accepted
	}{
		{"all serve every name", []string{both, both}, nil},
		{"unreachable replica is not judged", []string{dead, both}, nil},
		{"replica serving none is not judged", []string{other}, nil},
		{"alias missing on one replica", []string{both, plain},
			[]string{"line 4: deployments[0].models[1]", `"llama" is not served by r1 (` + plain + `)`, "does not rewrite", "--served-model-name " + full + " llama"}},
		{"alias missing on two replicas", []string{plain, dead, plain},
			[]string{"r0 (" + plain + "), r2 (" + plain + ")"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := VerifyServedModels(context.Background(), conf(tc.addrs...), nil)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted a model alias the replica does not serve")
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
				t.Errorf("%d problems for one alias:\n%v", n, err)
			}
		})
	}
}
