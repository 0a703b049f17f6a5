package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/proxyconf"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/nginx"
)

// TestRenderedFeedbackDefault: both proxies are rendered with completion
// feedback to turnout's default loopback listener when the config says
// nothing, and without it when feedback is disabled.
func TestRenderedFeedbackDefault(t *testing.T) {
	const deps = `
deployments:
  - name: a
    pools: [{role: mixed, endpoints: [{name: a0, address: "127.0.0.1:8001"}]}]
`
	for _, tc := range []struct {
		prefix string
		want   bool
	}{{"", true}, {"feedback: {disable: true}\n", false}} {
		cfg, err := config.ParseConfig([]byte(tc.prefix + deps))
		if err != nil {
			t.Fatal(err)
		}
		ha, err := haproxy.Render(cfg, haproxy.RenderOptions{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(ha.Config, []byte("log "+config.DefaultFeedbackAddr+" local0")); got != tc.want {
			t.Fatalf("%q: haproxy log target rendered %v, want %v", tc.prefix, got, tc.want)
		}
		ng, err := nginx.Render(cfg, nginx.RenderOptions{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(ng.Config, []byte("access_log syslog:server="+config.DefaultFeedbackAddr)); got != tc.want {
			t.Fatalf("%q: nginx syslog target rendered %v, want %v", tc.prefix, got, tc.want)
		}
	}
}

// TestRenderedTokenFilesPrivate: every rendered file that holds the
// feedback token is written 0600 (others stay 0644), also when an
// identical file was there at 0644; without a token nothing is 0600.
func TestRenderedTokenFilesPrivate(t *testing.T) {
	const tok = "s3cret-token-0123456789"
	const deps = `
deployments:
  - name: a
    pools: [{role: mixed, endpoints: [{name: a0, address: "127.0.0.1:8001"}]}]
`
	for _, withToken := range []bool{true, false} {
		prefix := "feedback: {token_file: \"off\"}\n"
		if withToken {
			prefix = "feedback: {token: " + tok + "}\n"
		}
		cfg, err := config.ParseConfig([]byte(prefix + deps))
		if err != nil {
			t.Fatal(err)
		}
		haDir, ngDir := t.TempDir(), t.TempDir()
		ha, err := haproxy.Render(cfg, haproxy.RenderOptions{Dir: haDir})
		if err != nil {
			t.Fatal(err)
		}
		ng, err := nginx.Render(cfg, nginx.RenderOptions{Dir: ngDir})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []struct {
			dir   string
			files []proxyconf.File
		}{{haDir, ha.Files()}, {ngDir, ng.Files()}} {
			// A file left at 0644 by an earlier write with the same bytes.
			last := r.files[len(r.files)-1]
			if err := os.WriteFile(filepath.Join(r.dir, last.Name), last.Data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := proxyconf.WriteFiles(r.dir, r.files); err != nil {
				t.Fatal(err)
			}
			holds := 0
			for _, f := range r.files {
				fi, err := os.Stat(filepath.Join(r.dir, f.Name))
				if err != nil {
					t.Fatal(err)
				}
				want := os.FileMode(0o644)
				if bytes.Contains(f.Data, []byte(tok)) {
					want = 0o600
					holds++
				}
				if fi.Mode().Perm() != want {
					t.Errorf("token %v: %s is %v, want %v", withToken, f.Name, fi.Mode().Perm(), want)
				}
			}
			if withToken && holds == 0 {
				t.Errorf("no rendered file in %s holds the token: the check above checked nothing", r.dir)
			}
		}
	}
}
