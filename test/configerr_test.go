//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const badConfig = `listen: 127.0.0.1:9090
fallbacks: 20
proxy:
  fail_mode: maybe
deployments:
  - name: llama
    pools:
      - endpoints:
          - {name: a, address: 127.0.0.1:8001}
`

// A config error reaches an operator as text with one line per problem at a
// terminal, and as one JSON event per problem (file, line, field) for a log
// collector; the two problems of badConfig are on lines 2 and 4.
func TestConfigErrorOutput(t *testing.T) {
	bin := TurnoutBin(t)
	path := filepath.Join(t.TempDir(), "turnout.yaml")
	if err := os.WriteFile(path, []byte(badConfig), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("json when not a terminal", func(t *testing.T) {
		cmd := exec.Command(bin, "serve", "--config", path)
		cmd.Env = append(os.Environ(), "TURNOUT_LOG_FORMAT=")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("bad config accepted:\n%s", out)
		}
		var lines []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("not one JSON event per line: %q", l)
			}
			lines = append(lines, m)
		}
		var got []string
		for _, m := range lines {
			if m["message"] == "config problem" {
				got = append(got, m["field"].(string)+"@"+jsonNum(m["line"]))
				if m["file"] != path {
					t.Errorf("event without the file: %v", m)
				}
			}
		}
		if strings.Join(got, " ") != "fallbacks@2 proxy.fail_mode@4" {
			t.Errorf("problems %v, want fallbacks@2 proxy.fail_mode@4\n%s", got, out)
		}
	})
	check := func(t *testing.T, out string) {
		t.Helper()
		for _, want := range []string{"invalid config " + path + " (2 problems):", "\n  line 2: fallbacks: 20 out of range", "\n  line 4: proxy.fail_mode: \"maybe\" must be open or closed"} {
			if !strings.Contains(out, want) {
				t.Errorf("text output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, `{"level"`) {
			t.Errorf("JSON at a terminal:\n%s", out)
		}
	}
	t.Run("text at a terminal", func(t *testing.T) {
		sc, err := exec.LookPath("script")
		if err != nil {
			t.Skip("script (util-linux) is not installed: no pseudo-terminal to test with")
		}
		// script runs the command on a pseudo-terminal, as an operator's shell would.
		cmd := exec.Command(sc, "-qec", bin+" serve --config "+path, "/dev/null")
		cmd.Env = append(os.Environ(), "TURNOUT_LOG_FORMAT=")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("bad config accepted:\n%s", out)
		}
		check(t, strings.ReplaceAll(string(out), "\r\n", "\n"))
	})
	t.Run("text when asked", func(t *testing.T) {
		cmd := exec.Command(bin, "render", "haproxy", "--config", path, "--out", t.TempDir())
		cmd.Env = append(os.Environ(), "TURNOUT_LOG_FORMAT=text")
		out, _ := cmd.CombinedOutput()
		check(t, string(out))
	})
}

func jsonNum(v any) string {
	if f, ok := v.(float64); ok {
		return strconv.Itoa(int(f))
	}
	return "?"
}
