package route

import (
	"errors"
	"strings"
	"testing"
)

// One case per kind of config error: each names the field path and the line
// it is on in the file, in words (no Go type names, no YAML library framing).
func TestConfigErrorLines(t *testing.T) {
	const ok = `deployments:
  - name: llama
    pools:
      - endpoints:
          - {name: a, address: 127.0.0.1:8001}
`
	for _, tc := range []struct {
		name, yaml string
		line       int
		path, msg  string
		atServer   bool // found when the policies are built (params)
	}{
		{"duration", "listen: 127.0.0.1:9090\nfallbacks: 2\ndecision_ttl: 10 minutes\n" + ok, 3, "decision_ttl", `"10 minutes" is not a duration such as 500ms`, false},
		{"nested duration", "health:\n  interval: 2s\n  timeout: soon\n" + ok, 3, "health.timeout", "not a duration", false},
		{"unknown field", "listen: 127.0.0.1:9090\nfallback: 2\n" + ok, 2, "fallback", `unknown field "fallback"; did you mean "fallbacks"?`, false},
		{"unknown nested field", ok + "        polcy: {name: round-robin}\n", 6, "deployments[0].pools[0].polcy", `unknown field "polcy"`, false},
		{"wrong kind", "fallbacks: two\n" + ok, 1, "fallbacks", `want an integer, got "two"`, false},
		{"list expected", "session_headers: x-session-id\n" + ok, 1, "session_headers", "want a list", false},
		{"key twice", "listen: 127.0.0.1:1\nmax_body: 2048\nlisten: 127.0.0.1:2\n" + ok, 3, "listen", "set twice (first on line 1)", false},
		{"yaml syntax (indentation)", "listen: 127.0.0.1:9090\ndeployments:\n  - name: a\n    pools:\n      - role: mixed\n     endpoints: []\n", 6, "", "YAML syntax", false},
		{"yaml syntax (bracket)", "listen: 127.0.0.1:9090\nsession_headers: [a, b\nmax_body: 4096\n" + ok, 2, "", "YAML syntax", false},
		{"validation", "deployments:\n  - name: llama\n    pools:\n      - endpoints:\n          - {name: a, address: 127.0.0.1:8001}\n          - {name: b, address: nowhere}\n", 6, "deployments[0].pools[0].endpoints[1].address", "must be host:port", false},
		{"name too long", "deployments:\n  - name: llama\n    pools:\n      - endpoints:\n          - {name: " + strings.Repeat("r", 64) + ", address: 127.0.0.1:8001}\n", 5, "deployments[0].pools[0].endpoints[0].name", "limited to 63", false},
		{"unknown policy", "deployments:\n  - name: llama\n    policy:\n      name: prefix-afinity\n    pools:\n      - endpoints: [{name: a, address: 127.0.0.1:8001}]\n", 4, "deployments[0].policy.name", `did you mean "prefix-affinity"`, true},
		{"unknown policy param", "deployments:\n  - name: llama\n    policy:\n      name: prefix-affinity\n      params:\n        blok_bytes: 128\n    pools:\n      - endpoints: [{name: a, address: 127.0.0.1:8001}]\n", 6, "deployments[0].policy.params.blok_bytes", `unknown field "blok_bytes"; did you mean "block_bytes"?`, true},
		{"policy param value", "deployments:\n  - name: llama\n    policy:\n      name: prefix-affinity\n      params: {block_bytes: big}\n    pools:\n      - endpoints: [{name: a, address: 127.0.0.1:8001}]\n", 5, "deployments[0].policy.params.block_bytes", `want an integer, got "big"`, true},
		{"policy param range", "deployments:\n  - name: llama\n    pools:\n      - endpoints: [{name: a, address: 127.0.0.1:8001}]\n        policy:\n          name: prefix-affinity\n          params:\n            block_bytes: 1\n", 8, "deployments[0].pools[0].policy.params", "block_bytes", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tc.yaml))
			if tc.atServer {
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				// turnout render checks policies without starting them: same answer.
				cerr := CheckPolicies(cfg, nil)
				var s *Server
				s, err = NewServer(cfg, Options{})
				if err == nil {
					s.Close()
				}
				if cerr == nil || err == nil || cerr.Error() != err.Error() {
					t.Errorf("CheckPolicies = %v, NewServer = %v: want the same error", cerr, err)
				}
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v (%T), want a ConfigError", err, err)
			}
			p := ce.Problems[0]
			if p.Line != tc.line || p.Path != tc.path || !strings.Contains(p.Msg, tc.msg) {
				t.Fatalf("got line %d path %q msg %q, want line %d path %q msg containing %q", p.Line, p.Path, p.Msg, tc.line, tc.path, tc.msg)
			}
			for _, leak := range []string{"route.", "yaml:", "!!", "unmarshal", "time.ParseDuration", "struct"} {
				if strings.Contains(err.Error(), leak) {
					t.Errorf("error leaks %q: %v", leak, err)
				}
			}
		})
	}
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
	if ok := mustConfig(t, fourEndpoints0()); len(ok.Warnings()) != 0 {
		t.Errorf("clean config warned: %v", ok.Warnings())
	}
}

func fourEndpoints0() string {
	return "deployments: [{name: a, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}, {name: b, address: 127.0.0.1:2}]}]}]"
}
