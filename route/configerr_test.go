package route

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
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
			cfg, err := config.ParseConfig([]byte(tc.yaml))
			if tc.atServer {
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				// turnout render checks policies without starting them: same answer.
				cerr := CheckPolicies(cfg, nil)
				var s *Decider
				s, err = New(cfg, Options{})
				if err == nil {
					s.Close()
				}
				if cerr == nil || err == nil || cerr.Error() != err.Error() {
					t.Errorf("CheckPolicies = %v, New = %v: want the same error", cerr, err)
				}
			}
			var ce *config.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, config.ErrConfig) {
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
