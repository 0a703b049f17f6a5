package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnout/turnout/lab/testenv/kubetest"
)

const alerts = "helm/turnout/files/turnout-alerts.yaml"

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		kubetest.Skip(t, "promtool not installed (apt-get install prometheus; .ci/run does): skipping alert rule test")
	}
	return p
}

// The alert rules are valid and their unit tests pass.
func TestAlertRules(t *testing.T) {
	pt := promtool(t)
	if out, err := run(t, pt, "check", "rules", alerts); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := run(t, pt, "test", "rules", "testdata/alerts-test.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules: no SUCCESS in %s", out)
	}
}

// promtool test rules fails on a wrong expectation: the unit tests above
// can fail.
func TestAlertRulesTestsCanFail(t *testing.T) {
	pt := promtool(t)
	abs, err := filepath.Abs(alerts)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "wrong.yaml")
	wrong := `rule_files: [` + abs + `]
tests:
  - interval: 1m
    input_series:
      - series: 'turnout_pool_ready_endpoints{deployment="llama",pool="llama_decode"}'
        values: '1x10'
    alert_rule_test:
      - eval_time: 5m
        alertname: TurnoutNoReadyEndpoint
        exp_alerts:
          - exp_labels: {severity: critical, deployment: llama, pool: llama_decode}
`
	if err := os.WriteFile(f, []byte(wrong), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, pt, "test", "rules", f); err == nil {
		t.Fatalf("promtool passed an alert that must not fire:\n%s", out)
	}
}
