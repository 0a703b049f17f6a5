package feedback

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// TestFeedbackDefault: a config without feedback gets it on loopback; one
// that turns it off while a pool balances on in-flight counts is warned
// about at start (and on every reload), and only then.
func TestFeedbackDefault(t *testing.T) {
	const deps = `
health: {disable: true}
deployments:
  - name: a
    policy: {name: %s}
    pools: [{role: mixed, endpoints: [{name: a0, address: "127.0.0.1:1"}]}]
`
	tests := []struct {
		name, feedback, policy string
		syslog                 string
		warn                   bool
	}{
		{"default is on", "", "least-request", config.DefaultFeedbackAddr, false},
		{"explicit address", "feedback: {syslog: 127.0.0.1:7000}", "least-request", "127.0.0.1:7000", false},
		{"off with least-request", "feedback: {disable: true}", "least-request", "", true},
		{"off with prefix-affinity", "feedback: {disable: true}", "prefix-affinity", "", true},
		{"off with session-hash", "feedback: {disable: true}", "session-hash", "", true},
		{"off with round-robin", "feedback: {disable: true}", "round-robin", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.feedback+strings.Replace(deps, "%s", tc.policy, 1))
			if cfg.Feedback.Syslog != tc.syslog {
				t.Fatalf("feedback.syslog %q, want %q", cfg.Feedback.Syslog, tc.syslog)
			}
			var buf bytes.Buffer
			log := zerolog.New(&buf)
			s, err := newServer(t, cfg, route.Options{Log: &log, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			warned := strings.Contains(buf.String(), `"level":"warn"`) && strings.Contains(buf.String(), "completion feedback is off")
			if warned != tc.warn {
				t.Fatalf("warned %v, want %v; log:\n%s", warned, tc.warn, buf.String())
			}
			if tc.warn && !strings.Contains(buf.String(), "a_mixed ("+tc.policy+")") {
				t.Fatalf("warning does not name the pool: %s", buf.String())
			}
		})
	}
	if _, err := config.ParseConfig([]byte("feedback: {disable: true, syslog: 127.0.0.1:1}" + strings.Replace(deps, "%s", "round-robin", 1))); err == nil {
		t.Fatal("disable with an address accepted")
	}
}
