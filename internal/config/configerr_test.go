package config

import (
	"errors"
	"strings"
	"testing"
)

func mustParse(t *testing.T, y string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(y))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

// An empty file (or only comments) says so instead of "EOF".
func TestConfigEmpty(t *testing.T) {
	for _, y := range []string{"", "\n\n", "# nothing yet\n"} {
		_, err := ParseConfig([]byte(y))
		if err == nil || !strings.Contains(err.Error(), "the file is empty") || strings.Contains(err.Error(), "EOF") {
			t.Fatalf("%q: %v", y, err)
		}
	}
}

// Several problems are all reported, one per line, in file order.
func TestConfigSeveralProblems(t *testing.T) {
	_, err := ParseConfig([]byte("fallbacks: 20\nproxy: {fail_mode: maybe}\ndeployments:\n  - name: 'a b'\n    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]\n"))
	var ce *ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("err = %v", err)
	}
	for i, want := range []int{1, 2, 4} {
		if ce.Problems[i].Line != want {
			t.Errorf("problem %d on line %d, want %d: %v", i, ce.Problems[i].Line, want, err)
		}
	}
	if got := strings.Count(err.Error(), "\n  line "); got != 3 {
		t.Errorf("want one indented line per problem:\n%v", err)
	}
}

// Accepted but suspicious: the same address twice, a pool without endpoints.
func TestConfigWarnings(t *testing.T) {
	cfg, err := ParseConfig([]byte(`deployments:
  - name: llama
    pools:
      - endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8001}
  - name: qwen
    pools:
      - role: mixed
        endpoints: []
`))
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Warnings()
	if len(w) != 2 {
		t.Fatalf("warnings: %v", w)
	}
	if w[0].Line != 6 || w[0].Path != "deployments[0].pools[0].endpoints[1].address" || !strings.Contains(w[0].Msg, "deployments[0].pools[0].endpoints[0]") {
		t.Errorf("duplicate address warning: %+v", w[0])
	}
	if w[1].Line != 10 || !strings.Contains(w[1].Msg, "qwen_mixed has no endpoints") {
		t.Errorf("empty pool warning: %+v", w[1])
	}
	if ok := mustParse(t, fourEndpoints0()); len(ok.Warnings()) != 0 {
		t.Errorf("clean config warned: %v", ok.Warnings())
	}
}

func fourEndpoints0() string {
	return "deployments: [{name: a, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}, {name: b, address: 127.0.0.1:2}]}]}]"
}
