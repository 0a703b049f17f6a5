//go:build e2e

package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// examples/ is what an operator copies to reach real vLLM servers: its
// config renders into a config HAProxy and nginx accept, its systemd units
// call turnout with flags turnout knows and pass systemd-analyze, and its
// Dockerfile builds with the Makefile.
func TestExamples(t *testing.T) {
	bin := TurnoutBin(t)
	root := repoRoot()
	cfg := filepath.Join(root, "examples", "vllm-2x4", "turnout.yaml")

	t.Run("config renders for haproxy", func(t *testing.T) {
		NeedHAProxy(t)
		dir := t.TempDir()
		// --check (default) runs haproxy -c on the result; the socket moves
		// into the temp dir because /run/haproxy may not exist here.
		out, err := exec.Command(bin, "render", "haproxy", "--config", cfg, "--out", dir, "--socket", filepath.Join(dir, "admin.sock")).CombinedOutput()
		if err != nil {
			t.Fatalf("render haproxy: %v\n%s", err, out)
		}
		if strings.Contains(string(out), "config warning") {
			t.Errorf("the example config has warnings:\n%s", out)
		}
		b, _ := os.ReadFile(filepath.Join(dir, "haproxy.cfg"))
		for _, want := range []string{"server gpu-a-0 10.0.0.11:8000", "server gpu-b-3 10.0.0.12:8003", "bind 0.0.0.0:8080", "noreuseport"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("haproxy.cfg lacks %q", want)
			}
		}
	})
	t.Run("config renders for nginx", func(t *testing.T) {
		NeedNginx(t)
		dir := t.TempDir()
		// kv-aware needs the body: nginx body mode through njs.
		out, err := exec.Command(bin, "render", "nginx", "--config", cfg, "--out", dir, "--nginx-user", "root").CombinedOutput()
		if err != nil {
			t.Fatalf("render nginx: %v\n%s", err, out)
		}
	})
	t.Run("vllm flags match the config", func(t *testing.T) {
		script, err := os.ReadFile(filepath.Join(root, "examples", "vllm-2x4", "vllm-serve.sh"))
		if err != nil {
			t.Fatal(err)
		}
		y, _ := os.ReadFile(cfg)
		models := regexp.MustCompile(`(?m)^\s+models: \[(.*)\]`).FindStringSubmatch(string(y))
		names := regexp.MustCompile(`NAMES=\$\{NAMES:-"(.*)"\}`).FindStringSubmatch(string(script))
		if models == nil || names == nil || strings.ReplaceAll(models[1], ",", "") != names[1] {
			t.Errorf("--served-model-name %v does not list the deployment's models %v", names, models)
		}
		for _, flag := range []string{"--served-model-name $NAMES", "--enable-prefix-caching", "--block-size 16", "enable_kv_cache_events", "$((8000 + i))", "$((5557 + i))", "$((5567 + i))"} {
			if !strings.Contains(string(script), flag) {
				t.Errorf("vllm-serve.sh lacks %s", flag)
			}
		}
		for i, host := range []string{"10.0.0.11", "10.0.0.12"} {
			for r := 0; r < 4; r++ {
				want := regexp.MustCompile(regexp.QuoteMeta(host+":"+itoa(8000+r)) + `, kv_events: tcp://` + regexp.QuoteMeta(host+":"+itoa(5557+r)) + `, kv_replay: tcp://` + regexp.QuoteMeta(host+":"+itoa(5567+r)))
				if !want.Match(y) {
					t.Errorf("host %d replica %d: no endpoint %s in turnout.yaml", i, r, want)
				}
			}
		}
	})
	t.Run("systemd units", func(t *testing.T) {
		for _, unit := range []string{"turnout.service", "nginx-turnout.conf"} {
			for _, line := range execLines(t, filepath.Join(root, "examples", "systemd", unit)) {
				args := strings.Fields(line)
				if len(args) == 0 || !strings.HasSuffix(args[0], "turnout") {
					continue
				}
				// Every flag must be known: --help after them exits 0 only then.
				out, err := exec.Command(bin, append(args[1:], "--help")...).CombinedOutput()
				if err != nil {
					t.Errorf("%s: %s: %v\n%s", unit, line, err, out)
				}
			}
		}
		if sa, err := exec.LookPath("systemd-analyze"); err == nil {
			dir := t.TempDir()
			b, _ := os.ReadFile(filepath.Join(root, "examples", "systemd", "turnout.service"))
			unit := filepath.Join(dir, "turnout.service")
			if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/turnout", bin)), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(sa, "verify", unit).CombinedOutput(); err != nil {
				t.Errorf("systemd-analyze verify turnout.service: %v\n%s", err, out)
			}
		}
	})
	t.Run("dockerfile builds like the makefile", func(t *testing.T) {
		df, err := os.ReadFile(filepath.Join(root, "examples", "Dockerfile"))
		if err != nil {
			t.Fatal(err)
		}
		mk, _ := os.ReadFile(filepath.Join(root, "Makefile"))
		if !regexp.MustCompile(`(?m)^RUN make build VERSION=`).Match(df) {
			t.Error("the Dockerfile does not build with make build")
		}
		if !regexp.MustCompile(`(?m)^BIN\s+:= bin/turnout$`).Match(mk) || !strings.Contains(string(df), "COPY --from=build /src/bin/turnout ") {
			t.Error("the Dockerfile copies another path than the Makefile's BIN")
		}
		if !strings.Contains(string(mk), "export CGO_ENABLED := 0") {
			t.Error("the Makefile no longer builds with CGO_ENABLED=0")
		}
		m := regexp.MustCompile(`(?m)^CMD \[(.*)\]`).FindSubmatch(df)
		if m == nil {
			t.Fatal("no CMD")
		}
		var args []string
		for _, a := range strings.Split(string(m[1]), ",") {
			args = append(args, strings.Trim(strings.TrimSpace(a), `"`))
		}
		if out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput(); err != nil {
			t.Errorf("CMD %v: %v\n%s", args, err, out)
		}
	})
}

// execLines returns the command lines of Exec*= settings in a unit file.
func execLines(t *testing.T, path string) []string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(l, "="); ok && strings.HasPrefix(k, "Exec") && v != "" {
			out = append(out, strings.TrimLeft(v, "-"))
		}
	}
	// The nginx drop-in names turnout's command lines in comments.
	b, _ := os.ReadFile(path)
	for _, m := range regexp.MustCompile(`(?m)^#.*?\b(turnout (?:render|serve) [^\n(]*)`).FindAllStringSubmatch(string(b), -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

// The nginx drop-in's turnout command lines are found (and so checked).
func TestExamplesExecLines(t *testing.T) {
	got := execLines(t, filepath.Join(repoRoot(), "examples", "systemd", "nginx-turnout.conf"))
	n := 0
	for _, l := range got {
		if strings.HasPrefix(l, "turnout ") {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("want the render and serve lines, got %q", got)
	}
}
