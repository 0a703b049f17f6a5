//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/nginx"
)

// nginx end-to-end tests: the turnout binary syncing a real nginx (1.22 +
// njs) in front of mock replicas, all on loopback ports picked at run time.

// NeedNginx skips the test when nginx or its njs module is missing.
func NeedNginx(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("nginx is not installed (apt-get install -y nginx libnginx-mod-http-js): skipping nginx end-to-end test")
	}
	if _, err := os.Stat(nginx.DefaultModulePath); err != nil {
		t.Skip("njs is not installed (" + nginx.DefaultModulePath + "; apt-get install -y libnginx-mod-http-js): skipping nginx end-to-end test")
	}
	return bin
}

// Nginx is an nginx master (daemon off) on a rendered directory.
type Nginx struct {
	*Proc
	Dir, URL string
}

// StartNginx runs nginx on dir/nginx.conf with dir as its prefix and waits
// until it accepts connections on listen.
func StartNginx(t testing.TB, dir, listen string) *Nginx {
	t.Helper()
	bin := NeedNginx(t)
	n := &Nginx{Dir: dir, URL: "http://" + listen}
	n.Proc = StartProc(t, "nginx", bin, "-p", dir, "-c", filepath.Join(dir, nginx.ConfigFile), "-e", "stderr", "-g", "daemon off;")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, nginx.ErrorLogName))
			if len(b) > 8<<10 {
				b = b[len(b)-8<<10:]
			}
			t.Logf("---- nginx error.log ----\n%s", b)
		}
	})
	Eventually(t, 10*time.Second, "nginx to listen on "+listen, func() bool {
		if n.Exited() {
			t.Fatalf("nginx exited: %v", n.err)
		}
		c, err := net.DialTimeout("tcp", listen, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return n
}

// Workers returns the master's worker pids, sorted.
func (n *Nginx) Workers() []int {
	w := nginx.Workers(n.Cmd.Process.Pid)
	slices.Sort(w)
	return w
}

// ndep is one deployment of an nginx test stack: mixed replicas, or
// prefill + decode replicas for prefill/decode.
type ndep struct {
	name, policy, mode string
	mocks              []*Mock
	prefill, decode    []*Mock
	// depYAML adds "key: value" lines to the deployment (e.g. flow_control).
	depYAML []string
}

// nstack is mocks + turnout (syncing nginx) + nginx.
type nstack struct {
	t                                *testing.T
	dir, turnoutAddr, ngAddr, syslog string
	failMode                         string
	noHealth                         bool   // turnout never marks a replica down
	extraYAML                        string // top-level config lines before deployments:
	deps                             []ndep
	T                                *Turnout
	N                                *Nginx
	client                           *http.Client
}

func (s *nstack) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, `listen: %s
session_headers: [x-session-id]
model_headers: [x-model]
max_body: 262144
fallbacks: 2
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms, disable: %v}
proxy:
  fail_mode: %s
  route_timeout: 500ms
  breaker_failures: 3
  breaker_cooldown: 30s
nginx: {listen: %q, dir: %q, mode: body}
%sdeployments:
`, s.turnoutAddr, s.syslog, s.noHealth, s.failMode, s.ngAddr, s.dir, s.extraYAML)
	pool := func(role string, ms []*Mock) {
		fmt.Fprintf(&b, "      - role: %s\n        endpoints:\n", role)
		for _, m := range ms {
			fmt.Fprintf(&b, "          - {name: %s, address: %q}\n", m.Name, m.Addr)
		}
	}
	for _, d := range s.deps {
		fmt.Fprintf(&b, "  - name: %s\n    models: [%s]\n    policy: %s\n    nginx_mode: %s\n", d.name, d.name, d.policy, d.mode)
		for _, l := range d.depYAML {
			fmt.Fprintf(&b, "    %s\n", l)
		}
		b.WriteString("    pools:\n")
		if len(d.prefill) > 0 {
			pool(config.RolePrefill, d.prefill)
			pool(config.RoleDecode, d.decode)
			continue
		}
		pool(config.RoleMixed, d.mocks)
	}
	return b.String()
}

// startNginxStack starts turnout with --nginx-dir (its first sync writes the
// nginx files), then nginx on them.
func startNginxStack(t *testing.T, failMode string, deps ...ndep) *nstack {
	t.Helper()
	return (&nstack{failMode: failMode, deps: deps}).start(t)
}

func (s *nstack) start(t *testing.T) *nstack {
	t.Helper()
	NeedNginx(t)
	s.t, s.dir, s.turnoutAddr, s.ngAddr, s.syslog = t, t.TempDir(), FreeAddr(t), FreeAddr(t), FreeUDPAddr(t)
	s.client = &http.Client{Timeout: 30 * time.Second}
	extra := []string{"--nginx-dir", s.dir, "--watch", "100ms"}
	if os.Geteuid() == 0 {
		// Workers would run as nobody, which cannot enter t.TempDir().
		extra = append(extra, "--nginx-user", "root")
	}
	s.T = StartTurnout(t, s.turnoutAddr, s.yaml(), extra...)
	Eventually(t, 20*time.Second, "turnout to write nginx.conf", func() bool {
		_, err := os.Stat(filepath.Join(s.dir, nginx.ConfigFile))
		return err == nil
	})
	s.N = StartNginx(t, s.dir, s.ngAddr)
	return s
}

func (s *nstack) post(t *testing.T, path string, body []byte, hdr map[string]string) *Response {
	t.Helper()
	r, err := Post(context.Background(), s.client, s.N.URL+path, body, hdr)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

// dep returns the deployment named name.
func (s *nstack) dep(name string) *ndep {
	for i := range s.deps {
		if s.deps[i].name == name {
			return &s.deps[i]
		}
	}
	s.t.Fatalf("no deployment %s", name)
	return nil
}

func (s *nstack) mock(name string) *Mock {
	for _, d := range s.deps {
		for _, m := range slices.Concat(d.mocks, d.prefill, d.decode) {
			if m.Name == name {
				return m
			}
		}
	}
	return nil
}
