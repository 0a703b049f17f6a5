//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runCheck runs `turnout check` with JSON logs and returns its exit code
// and its events.
func runCheck(t *testing.T, args ...string) (int, []map[string]any) {
	t.Helper()
	cmd := exec.Command(TurnoutBin(t), append([]string{"check"}, args...)...)
	cmd.Env = append(os.Environ(), "TURNOUT_LOG_FORMAT=json")
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var evs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not one JSON event per line: %q\n%s", l, out)
		}
		evs = append(evs, m)
	}
	return code, evs
}

func messages(evs []map[string]any) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%v %v %v %v\n", e["level"], e["check"], e["field"], e["message"])
	}
	return b.String()
}

// turnout check on a good config: exit 0, every replica's models, both
// rendered proxies accepted by their own binaries; an unreachable replica
// is a warning, a problem with --require-endpoints. On a broken config:
// exit 1 and every problem listed, each with its field and line.
func TestCheckCommand(t *testing.T) {
	ms := mocks(t, "check", 2, nil)
	dir := t.TempDir()
	good := fmt.Sprintf(`deployments:
  - name: llama
    models: [llama]
    pools:
      - endpoints:
          - {name: %s, address: %q}
          - {name: %s, address: %q}
`, ms[0].Name, ms[0].Addr, ms[1].Name, ms[1].Addr)
	path := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	code, evs := runCheck(t, "--config", path, "--nginx-user", "root")
	if code != 0 {
		t.Fatalf("good config: exit %d\n%s", code, messages(evs))
	}
	got := messages(evs)
	for _, want := range []string{"endpoint deployments[0].pools[0].endpoints[0] endpoint answers", "endpoint deployments[0].pools[0].endpoints[1] endpoint answers", "check passed"} {
		if !strings.Contains(got, want) {
			t.Errorf("good config: no %q in\n%s", want, got)
		}
	}
	for _, proxy := range []string{"haproxy", "nginx"} {
		if _, err := exec.LookPath(proxy); err == nil && !strings.Contains(got, "rendered "+proxy+" config ok") {
			t.Errorf("good config: %s not checked:\n%s", proxy, got)
		}
	}

	// One replica gone: a warning, still exit 0; with --require-endpoints exit 1.
	down := strings.Replace(good, ms[1].Addr, FreeAddr(t), 1)
	if err := os.WriteFile(path, []byte(down), 0o644); err != nil {
		t.Fatal(err)
	}
	code, evs = runCheck(t, "--config", path, "--proxy", "none")
	if code != 0 || !strings.Contains(messages(evs), "warn endpoint deployments[0].pools[0].endpoints[1] endpoint unreachable") {
		t.Errorf("unreachable replica: exit %d\n%s", code, messages(evs))
	}
	code, evs = runCheck(t, "--config", path, "--proxy", "none", "--require-endpoints")
	if code != 1 || !strings.Contains(messages(evs), "error endpoint deployments[0].pools[0].endpoints[1] endpoint unreachable") {
		t.Errorf("unreachable replica with --require-endpoints: exit %d\n%s", code, messages(evs))
	}

	// Problems of every stage at once: a bare duration, a value out of
	// range, an unknown field, an unknown policy, a TLS setting.
	bad := `fallbacks: 20
health: {interval: 5}
haproxy: {tls: {cert: /x/c.pem, min_version: TLSv1.1}}
deployments:
  - name: llama
    policy: {name: round-robbin}
    pools:
      - endpoints:
          - {name: a, address: 127.0.0.1:1, weigth: 2}
`
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	code, evs = runCheck(t, "--config", path)
	if code != 1 {
		t.Fatalf("broken config: exit %d\n%s", code, messages(evs))
	}
	var problems []string
	for _, e := range evs {
		if e["message"] == "config problem" {
			problems = append(problems, fmt.Sprintf("%v@%v", e["field"], e["line"]))
		}
	}
	want := "fallbacks@1 health.interval@2 haproxy.tls.min_version@3 deployments[0].policy.name@6 deployments[0].pools[0].endpoints[0].weigth@9"
	if strings.Join(problems, " ") != want {
		t.Errorf("problems %q\nwant     %q\n%s", strings.Join(problems, " "), want, messages(evs))
	}
}

// turnout serve logs the nginx header-mode warnings at start, as check
// does: two deployments all in header mode, one with a prompt policy.
func TestServeWarnsNginxHeaderMode(t *testing.T) {
	listen := FreeAddr(t)
	cfg := fmt.Sprintf(`listen: %s
feedback: {syslog: %s, token_file: "off"}
nginx: {mode: header}
deployments:
  - name: llama
    models: [llama]
    policy: {name: prefix-affinity}
    pools: [{role: mixed, endpoints: [{name: l0, address: "127.0.0.1:1"}]}]
  - name: qwen
    models: [qwen]
    pools: [{role: mixed, endpoints: [{name: q0, address: "127.0.0.1:2"}]}]
`, listen, FreeAddr(t))
	tu := StartTurnout(t, listen, cfg)
	want := []string{"400 model_required", "policy prefix-affinity reads the prompt"}
	Eventually(t, 10*time.Second, "the header-mode warnings in serve's log", func() bool {
		b, _ := os.ReadFile(tu.Log)
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			var ev map[string]any
			if json.Unmarshal([]byte(l), &ev) != nil || ev["message"] != "config warning" || ev["field"] != "nginx.mode" {
				continue
			}
			for _, w := range want {
				if strings.Contains(fmt.Sprint(ev["problem"]), w) {
					n++
				}
			}
		}
		return n == len(want)
	})
}
