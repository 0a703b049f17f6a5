package haproxy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/tlstest"
)

// frontYAML sets everything render_front.go adds: TLS, worker user and
// chroot, extra lines in every section. goldenDir is inside the chroot.
const frontYAML = `haproxy:
  listen: 127.0.0.1:8443
  tls: {cert: /etc/turnout/tls/server.pem, min_version: TLSv1.3}
  user: haproxy
  group: haproxy
  chroot: /etc/turnout
  extra:
    global: [tune.ssl.cachesize 20000]
    defaults: [timeout tunnel 1h]
    frontend: ["http-response set-header Strict-Transport-Security max-age=31536000"]
    backend: [http-reuse always]
deployments:
  - name: llama
    pools: [{endpoints: [{name: a, address: 127.0.0.1:8001}]}]
`

// The front settings render where HAProxy wants them, and the unix socket
// the workers connect to after chroot is named as seen inside it.
func TestRenderFrontGolden(t *testing.T) {
	out, err := Render(mustParse(t, []byte(frontYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "front.haproxy.cfg.golden")
	if *update {
		if err := os.WriteFile(golden, out.Config, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./haproxy -update)", err)
	}
	if !bytes.Equal(out.Config, want) {
		t.Errorf("front render differs from %s (run with -update after checking the diff):\n%s", golden, out.Config)
	}
	for _, line := range []string{
		"    bind 127.0.0.1:8443 ssl crt /etc/turnout/tls/server.pem alpn h2,http/1.1 ssl-min-ver TLSv1.3\n",
		"    user haproxy\n    group haproxy\n",
		"    chroot /etc/turnout\n",
		"    tune.ssl.cachesize 20000\n",
		"    timeout tunnel 1h\n",
		"    http-response set-header Strict-Transport-Security max-age=31536000\n",
		"    http-reuse always\n",
		"    server agent0 unix@/haproxy/spoe.sock ",
	} {
		if !strings.Contains(string(out.Config), line) {
			t.Errorf("render lacks %q", line)
		}
	}
}

// Sync keeps the extra lines: they are in the structure hash the file
// carries, so the same config planned against its own rendered file is no
// reload, and a changed extra line is one.
func TestExtraIsNotDrift(t *testing.T) {
	cfg := mustParse(t, []byte(frontYAML))
	a, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	live := a.State
	live.Structure = StructureOf(a.Config)
	if p := Diff(a.State, live); p.Reload {
		t.Fatalf("the same render plans a reload: %+v", p)
	}
	cfg.HAProxy.Extra.Backend = []string{"http-reuse safe"}
	b, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	if p := Diff(b.State, live); !p.Reload {
		t.Fatalf("a changed extra line plans no reload: %+v", p)
	}
}

// The render with TLS, user, chroot and extra lines passes haproxy -c with
// real certificate files; missing or mismatched files are named before.
func TestRenderFrontHAProxyCheck(t *testing.T) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed: skipping haproxy -c")
	}
	tls := tlstest.Write(t, t.TempDir())
	y := strings.Replace(frontYAML, "/etc/turnout/tls/server.pem", tls.Cert, 1)
	// A chroot the scratch directory of the check is not in: the check
	// renders with the scratch directory as the chroot.
	y = strings.Replace(y, "chroot: /etc/turnout", "chroot: /var/empty-turnout-chroot", 1)
	y = strings.Replace(y, "user: haproxy\n  group: haproxy", "user: nobody\n  group: nogroup", 1)
	cfg := mustParse(t, []byte(y))
	r, err := NewRenderer(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(context.Background(), bin, cfg, RenderOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(tls.Key); err != nil {
		t.Fatal(err)
	}
	err = r.Check(context.Background(), bin, cfg, RenderOptions{})
	if !errors.Is(err, ErrRender) || !strings.Contains(err.Error(), "haproxy.tls") {
		t.Fatalf("check without the key: %v", err)
	}
}

// Config mistakes in the front settings are refused at load, with the field.
func TestFrontConfigProblems(t *testing.T) {
	y := `haproxy:
  tls: {cert: relative.pem, key: /x/other.key, min_version: TLSv1.0, alpn: [h3]}
  chroot: /var/lib/haproxy
  extra: {global: ["ok", "two\nlines"]}
nginx:
  tls: {cert: /x/c.pem, alpn: [h2]}
  extra: {server: [add_header X-A b]}
deployments: [{name: a, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]}]
`
	_, err := config.ParseConfig([]byte(y))
	var ce *config.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v", err)
	}
	var got []string
	for _, p := range ce.Problems {
		got = append(got, p.Path)
	}
	for _, want := range []string{"haproxy.tls.cert", "haproxy.tls.key", "haproxy.tls.min_version", "haproxy.tls.alpn[0]", "haproxy.chroot", "haproxy.extra.global[1]", "nginx.tls.alpn", "nginx.extra.server[0]"} {
		if !strings.Contains(" "+strings.Join(got, " ")+" ", " "+want+" ") {
			t.Errorf("no problem for %s in %v", want, got)
		}
	}
	for _, p := range ce.Problems {
		if p.Line == 0 {
			t.Errorf("%s has no line", p.Path)
		}
	}
}

// On the Lua path the hop's socket belongs to the workers' user (mode 600
// would lock them out once they drop root), and the Lua reaches it at its
// in-chroot path.
func TestRenderFrontLuaPath(t *testing.T) {
	y := strings.Replace(frontYAML, "haproxy:\n", "haproxy:\n  path: lua\n", 1)
	y = strings.Replace(y, "deployments:", "proxy: {route_addrs: [127.0.0.1:9090]}\ndeployments:", 1)
	out, err := Render(mustParse(t, []byte(y)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	if want := "    bind unix@" + goldenDir + "/route.sock mode 600 user haproxy group haproxy\n"; !strings.Contains(string(out.Config), want) {
		t.Errorf("render lacks %q", want)
	}
	if want := `"unix@/haproxy/route.sock"`; !strings.Contains(string(out.Lua), want) {
		t.Errorf("Lua lacks %s", want)
	}
	// Outside the chroot: refused with the field.
	y = strings.Replace(y, "chroot: /etc/turnout", "chroot: /srv/elsewhere", 1)
	if _, err := Render(mustParse(t, []byte(y)), RenderOptions{Dir: goldenDir}); err == nil || !strings.Contains(err.Error(), "haproxy.chroot") {
		t.Errorf("socket outside the chroot: %v", err)
	}
}
