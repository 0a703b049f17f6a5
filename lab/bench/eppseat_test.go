package bench

import (
	"slices"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/policy"
)

// The replay's seats: a comma list of known names, each once; a turnout
// row names its seat unless it is HAProxy's (the proxy-alone rows name
// their own); no fronts in the epp seat; its config parses with the
// Endpoint Picker on.
func TestEPPSeatOptions(t *testing.T) {
	got, err := ParseProxies(" haproxy, epp")
	if err != nil || !slices.Equal(got, []string{ProxyHAProxy, ProxyEPP}) {
		t.Fatalf("haproxy,epp: %v %v", got, err)
	}
	for _, bad := range []string{"", "envoy", "epp,epp", "haproxy,"} {
		if _, err := ParseProxies(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	spec := PolicySpec{Policy: policy.PrefixAffinityType}
	if m := e2eMode(spec, E2EOptions{ProxySetup: ProxySetup{Proxy: ProxyEPP}}); m != ModeE2EEPP {
		t.Fatalf("mode %q", m)
	}
	for _, r := range []struct{ mode, policy, want string }{
		{ModeE2EEPP, "prefix-affinity", "prefix-affinity (epp)"},
		{"e2e-nginx-header", "session-hash", "session-hash (nginx)"},
		{"e2e-nginx", NginxRoundRobin, NginxRoundRobin},
		{"e2e", "prefix-affinity", "prefix-affinity"},
	} {
		if l := (&Row{Mode: r.mode, Policy: r.policy}).Label(); l != r.want {
			t.Errorf("%s %s: label %q, want %q", r.mode, r.policy, l, r.want)
		}
	}
	if m := e2eMode(PolicySpec{Policy: HAProxyRoundRobin}, E2EOptions{ProxySetup: ProxySetup{Proxy: ProxyEPP}}); m != "e2e" {
		t.Fatalf("haproxy alone in an epp run: mode %q", m)
	}
	o := E2EOptions{ProxySetup: ProxySetup{Proxy: ProxyEPP}, Fronts: []int{2}, TimeScale: 1, Sim: DefaultSimOptions()}
	if err := o.validate([]PolicySpec{spec}); err == nil || !strings.Contains(err.Error(), "fronts") {
		t.Fatalf("fronts in the epp seat: %v", err)
	}
	cfgText := TurnoutConfig(ConfigOptions{Listen: "127.0.0.1:9", Model: "llama", Policy: spec, DisableHealth: true,
		EPPListen: "127.0.0.1:9002", EPPTLS: config.EPPTLSSelfSigned, Endpoints: []Endpoint{{Name: "r0", Address: "127.0.0.1:1"}}})
	cfg, err := config.ParseConfig(cfgText)
	if err != nil {
		t.Fatalf("%v\n%s", err, cfgText)
	}
	if cfg.EPP.Listen != "127.0.0.1:9002" || cfg.EPP.TLS.Mode != config.EPPTLSSelfSigned {
		t.Fatalf("epp section %+v", cfg.EPP)
	}
}
