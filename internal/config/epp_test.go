package config

import (
	"errors"
	"strings"
	"testing"
)

// The epp section: off by default, self-signed TLS once on, and each bad
// value named with its field and line, all at once.
func TestEPPConfig(t *testing.T) {
	const deps = "deployments:\n  - name: a\n    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]\n"
	c := mustParse(t, deps)
	if c.EPP.On() || c.EPP.TLS.Mode != EPPTLSSelfSigned || c.EPP.Server != EPPServerInline {
		t.Errorf("defaults: %+v", c.EPP)
	}
	if c.EPP.ListedPicks(3) != 3 {
		t.Errorf("no epp.fallbacks lists %d of 3", c.EPP.ListedPicks(3))
	}
	if c = mustParse(t, "epp: {fallbacks: 0}\n"+deps); c.EPP.ListedPicks(3) != 1 || c.EPP.ListedPicks(0) != 0 {
		t.Errorf("epp.fallbacks 0 lists %d of 3", c.EPP.ListedPicks(3))
	}
	if _, err := ParseConfig([]byte("epp: {fallbacks: -1}\n" + deps)); err == nil || !strings.Contains(err.Error(), "epp.fallbacks") {
		t.Errorf("epp.fallbacks -1: %v", err)
	}
	if c = mustParse(t, "epp: {listen: ':9002', server: grpc}\n"+deps); c.EPP.Server != EPPServerGRPC {
		t.Errorf("server: %+v", c.EPP)
	}
	c = mustParse(t, "epp: {listen: ':9002', health_listen: ':9003', tls: {mode: files, cert_file: /c, key_file: /k}}\n"+deps)
	if !c.EPP.On() || c.EPP.TLS.CertFile != "/c" {
		t.Errorf("files: %+v", c.EPP)
	}

	_, err := ParseConfig([]byte(`listen: 127.0.0.1:8080
epp:
  listen: 127.0.0.1:8080
  health_listen: nope
  tls:
    mode: mtls
deployments:
  - name: a
    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]
`))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v", err)
	}
	want := map[string]int{"epp.listen": 3, "epp.health_listen": 4, "epp.tls.mode": 6}
	got := map[string]int{}
	for _, p := range ce.Problems {
		got[p.Path] = p.Line
	}
	for f, line := range want {
		if got[f] != line {
			t.Errorf("%s: line %d, want %d (%v)", f, got[f], line, err)
		}
	}
	for _, tc := range []struct{ yaml, field string }{
		{"epp: {listen: ':9002', tls: {mode: files, key_file: /k}}\n", "epp.tls.cert_file"},
		{"epp: {listen: ':9002', tls: {mode: off, cert_file: /c}}\n", "epp.tls.mode"},
		{"epp: {health_listen: ':9003'}\n", "epp.health_listen"},
		{"epp: {listen: ':9002', server: grpc-go}\n", "epp.server"},
	} {
		_, err := ParseConfig([]byte(tc.yaml + deps))
		if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Path != tc.field {
			t.Errorf("%q: %v, want one problem at %s", tc.yaml, err, tc.field)
		}
	}
}
