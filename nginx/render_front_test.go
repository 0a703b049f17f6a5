package nginx

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnout/turnout/lab/testenv/tlstest"
)

// frontYAML sets everything render_front.go adds: TLS and extra lines.
const frontYAML = `nginx:
  listen: 127.0.0.1:8443
  tls: {cert: /etc/turnout/tls/server.pem, key: /etc/turnout/tls/server.key}
  extra:
    http: ["ssl_session_cache shared:turnout_tls:10m;"]
    server: ["add_header Strict-Transport-Security max-age=31536000 always;"]
deployments:
  - name: llama
    pools: [{endpoints: [{name: a, address: 127.0.0.1:8001}]}]
`

// TLS renders as nginx 1.22 spells it (listen ... ssl http2), the extra
// lines land in their blocks.
func TestRenderFrontGolden(t *testing.T) {
	out, err := Render(mustParse(t, []byte(frontYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "front.nginx.conf.golden")
	if *update {
		if err := os.WriteFile(golden, out.Config, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./nginx -update)", err)
	}
	if !bytes.Equal(out.Config, want) {
		t.Errorf("front render differs from %s (run with -update after checking the diff):\n%s", golden, out.Config)
	}
	for _, line := range []string{
		"        listen 127.0.0.1:8443 ssl http2;\n",
		"        ssl_certificate /etc/turnout/tls/server.pem;\n        ssl_certificate_key /etc/turnout/tls/server.key;\n        ssl_protocols TLSv1.2 TLSv1.3;\n",
		"    ssl_session_cache shared:turnout_tls:10m;\n",
		"        add_header Strict-Transport-Security max-age=31536000 always;\n",
	} {
		if !strings.Contains(string(out.Config), line) {
			t.Errorf("render lacks %q", line)
		}
	}
	// http/1.1 only, TLS 1.3 only.
	cfg := mustParse(t, []byte(strings.Replace(frontYAML, "key: /etc/turnout/tls/server.key}", "key: /etc/turnout/tls/server.key, alpn: [http/1.1], min_version: TLSv1.3}", 1)))
	out, err = Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out.Config), "listen 127.0.0.1:8443 ssl;\n") || !strings.Contains(string(out.Config), "ssl_protocols TLSv1.3;\n") {
		t.Errorf("alpn [http/1.1], TLSv1.3:\n%s", out.Config)
	}
}

// With real certificate files the render passes nginx -t; a missing key is
// named before nginx runs.
func TestRenderFrontNginxT(t *testing.T) {
	bin := nginxBin(t)
	tls := tlstest.Write(t, t.TempDir())
	y := strings.Replace(frontYAML, "/etc/turnout/tls/server.pem", tls.Cert, 1)
	y = strings.Replace(y, "/etc/turnout/tls/server.key", tls.Key, 1)
	r, err := NewRenderer(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, []byte(y))
	if err := r.Check(context.Background(), bin, cfg, RenderOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(tls.Key); err != nil {
		t.Fatal(err)
	}
	if err := r.Check(context.Background(), bin, cfg, RenderOptions{}); !errors.Is(err, ErrRender) || !strings.Contains(err.Error(), "nginx.tls") {
		t.Fatalf("check without the key: %v", err)
	}
}

// Sync keeps the extra lines: a second sync of the same config finds the
// files unchanged (no rewrite, hence no reload), with the lines in place.
func TestSyncKeepsExtra(t *testing.T) {
	dir := t.TempDir()
	s, err := NewSyncer(SyncOptions{Render: RenderOptions{Dir: dir}, NginxBin: "-"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(frontYAML, "  tls: {cert: /etc/turnout/tls/server.pem, key: /etc/turnout/tls/server.key}\n", "", 1)
	ctx := context.Background()
	if err := s.Sync(ctx, mustParse(t, []byte(y))); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, ConfigFile)
	st1, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx, mustParse(t, []byte(y))); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(path)
	if !os.SameFile(st1, st2) {
		t.Error("a second sync of the same config with extra lines rewrote nginx.conf")
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "add_header Strict-Transport-Security max-age=31536000 always;") {
		t.Error("the extra server line is not in the synced nginx.conf")
	}
}
