package main

import (
	"bytes"
	"testing"

	"github.com/turnout/turnout/internal/config"

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
