//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's hand-made decisions run as written (against a turnout on a
// test port) and close what they open: no decision stays in flight.
func TestREADMEByHand(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	b, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	sec := string(b)
	i := strings.Index(sec, "## Try the contract by hand")
	if i < 0 {
		t.Fatal("README has no 'Try the contract by hand' section")
	}
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(sec[i:])
	if m == nil {
		t.Fatal("no sh block in the section")
	}
	// make run's config (the embedded default) on test ports; no replicas
	// behind it, so no health checks.
	def, err := os.ReadFile(filepath.Join(repoRoot(), "internal", "config", "default_config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	addr := FreeAddr(t)
	cfg := strings.NewReplacer("127.0.0.1:9090", addr, "127.0.0.1:9514", FreeUDPAddr(t), "health:\n  interval: 2s", "health: {disable: true}").Replace(string(def))
	if !strings.Contains(cfg, "disable: true") {
		t.Fatalf("default config changed shape; adapt this test:\n%s", cfg)
	}
	tu := StartTurnout(t, addr, cfg, "--watch", "0")
	script := strings.ReplaceAll(m[1], "127.0.0.1:9090", addr)
	if strings.Contains(script, "make run") {
		t.Fatalf("the block starts make run itself (it is meant for a second terminal):\n%s", script)
	}
	out, err := exec.Command("bash", "-c", "set -e -o pipefail\n"+script).CombinedOutput()
	if err != nil {
		t.Fatalf("README block: %v\n%s", err, out)
	}
	servers := regexp.MustCompile(`(?i)x-turnout-server: (\S+)`).FindAllStringSubmatch(string(out), -1)
	if len(servers) != 3 || servers[0][1] != servers[1][1] || servers[1][1] != servers[2][1] {
		t.Errorf("want the same server three times, got %v\n%s", servers, out)
	}
	decided, _ := Metric(t, tu.URL+"/metrics", "turnout_endpoint_decisions_total")
	if v, err := Metric(t, tu.URL+"/metrics", "turnout_completions_total", `result="completed"`); err != nil || v != decided || v < 4 {
		t.Errorf("completed decisions = %v (%v), want all %v of them (>= 4)", v, err, decided)
	}
	if v, err := Metric(t, tu.URL+"/metrics", "turnout_endpoint_inflight"); err != nil || v != 0 {
		t.Errorf("in flight after the README's examples = %v (%v), want 0\n%s", v, err, out)
	}
	if !strings.Contains(string(out), `"code":"model_not_found"`) {
		t.Errorf("the unknown-model example did not answer with an OpenAI-style error:\n%s", out)
	}
}
