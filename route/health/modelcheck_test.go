package health

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/internal/routetest"
)

// A replica whose /v1/models lacks one of the deployment's model names is
// named, with the vLLM flag that fixes it, in the log and in /metrics; a
// replica serving every name is not.
func TestServedModelsCheck(t *testing.T) {
	served := func(ids ...string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != ServedModelsPath {
				http.NotFound(w, r)
				return
			}
			var items []string
			for _, id := range ids {
				items = append(items, fmt.Sprintf(`{"id":%q,"object":"model"}`, id))
			}
			fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(items, ","))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	const full = "meta-llama/Llama-3.1-8B-Instruct"
	a := served(full)          // started without the alias
	b := served(full, "llama") // --served-model-name meta-llama/Llama-3.1-8B-Instruct llama
	cfg := routetest.MustConfig(t, fmt.Sprintf(`health: {disable: true}
deployments:
  - name: llama
    models: [%s, llama]
    pools:
      - endpoints:
          - {name: a, address: %s}
          - {name: b, address: %s}
`, full, strings.TrimPrefix(a.URL, "http://"), strings.TrimPrefix(b.URL, "http://")))
	var logs bytes.Buffer
	log := zerolog.New(&logs)
	s, err := route.New(cfg, route.Options{Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go New(s).CheckServedModels(ctx, 50*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	var m strings.Builder
	for {
		m.Reset()
		s.WriteMetrics(&m)
		if strings.Contains(m.String(), `turnout_endpoint_model_missing{endpoint="a",model="llama"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no missing-model metric for a:\n%s", m.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(m.String(), `turnout_endpoint_model_missing{endpoint="b"`) {
		t.Errorf("b serves every name but is reported:\n%s", m.String())
	}
	out := logs.String()
	if !strings.Contains(out, `endpoint a does not serve \"llama\"`) || !strings.Contains(out, "add it to its --served-model-name") || strings.Contains(out, "--served-model-name "+full+" llama") {
		t.Errorf("warning does not name the endpoint, the alias and a fix that cannot misroute:\n%s", out)
	}
	if strings.Contains(out, "endpoint b ") {
		t.Errorf("warned about b:\n%s", out)
	}
}
