//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func serveCfg(listen string, endpoints ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nhealth: {disable: true}\ndeployments:\n  - name: llama\n    policy: {name: least-request}\n    pools:\n      - role: mixed\n        endpoints:\n", listen)
	for i, e := range endpoints {
		fmt.Fprintf(&b, "          - {name: %s, address: 127.0.0.1:%d}\n", e, 9100+i)
	}
	return b.String()
}

// TestServeReloadSIGHUP: turnout serve swaps configs on SIGHUP, rejects a bad
// file with a logged reason and keeps serving the old one.
func TestServeReloadSIGHUP(t *testing.T) {
	addr := FreeAddr(t)
	tu := StartTurnout(t, addr, serveCfg(addr, "a", "b"), "--watch", "0")
	servers := func() map[string]bool {
		out := map[string]bool{}
		for i := 0; i < 20; i++ {
			r, err := Post(context.Background(), http.DefaultClient, tu.URL+"/internal/route", []byte(`{"model":"llama","prompt":"x"}`), nil)
			if err != nil || r.Status != 200 {
				t.Fatalf("route: %v %+v", err, r)
			}
			out[r.Header.Get("X-Turnout-Server")] = true
		}
		return out
	}
	if got := servers(); !got["a"] || !got["b"] || len(got) != 2 {
		t.Fatalf("servers before reload: %v", got)
	}
	if err := os.WriteFile(tu.ConfigPath, []byte(serveCfg(addr, "a", "c")), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = tu.Cmd.Process.Signal(syscall.SIGHUP)
	Eventually(t, 5*time.Second, "c to serve after SIGHUP", func() bool { got := servers(); return got["c"] && !got["b"] })
	if err := os.WriteFile(tu.ConfigPath, []byte("deployments: [{name: 'bad name'}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = tu.Cmd.Process.Signal(syscall.SIGHUP)
	Eventually(t, 5*time.Second, "the bad config to be rejected", func() bool {
		v, _ := Metric(t, tu.URL+"/metrics", "turnout_config_reloads_total", `result="rejected"`)
		return v == 1
	})
	if got := servers(); !got["a"] || !got["c"] || len(got) != 2 {
		t.Fatalf("servers after a rejected reload: %v", got)
	}
	if b, _ := os.ReadFile(tu.Log); !strings.Contains(string(b), "config rejected") || !strings.Contains(string(b), "deployments[0].name") {
		t.Fatalf("no logged reason naming the field in:\n%s", b)
	}
}

// TestCLI: --help, version, and a clear error for bad usage.
func TestCLI(t *testing.T) {
	bin := TurnoutBin(t)
	for _, tc := range []struct {
		args []string
		ok   bool
		want string
	}{
		{[]string{"--help"}, true, "turnout serve"},
		{[]string{"version"}, true, "turnout "},
		{[]string{"frobnicate"}, false, "unknown command"},
		{[]string{"serve", "--config", "/nonexistent.yaml"}, false, "read config"},
		{[]string{"render", "nope"}, false, "unknown target"},
	} {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		if (err == nil) != tc.ok || !strings.Contains(string(out), tc.want) {
			t.Fatalf("turnout %v: err=%v out=%s", tc.args, err, out)
		}
	}
}
