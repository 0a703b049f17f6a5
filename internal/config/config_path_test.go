package config

import (
	"strings"
	"testing"
)

// haproxy.path: SPOE unless the config sends the proxy to other turnouts
// without an agent address; route_body bounded by max_body.
func TestHAProxyPathAndRouteBody(t *testing.T) {
	base := "listen: 127.0.0.1:9090\ndeployments: [{name: m, pools: [{endpoints: [{name: e0, address: 127.0.0.1:1}]}]}]\n"
	cases := []struct {
		name, yaml, path, err string
		routeBody             int
	}{
		{"default", base, HAProxyPathSPOE, "", DefaultRouteBody},
		{"route_addrs elsewhere", base + "proxy: {route_addrs: [10.0.0.2:9090]}\n", HAProxyPathLua, "", DefaultRouteBody},
		{"route_addrs with an agent address", base + "proxy: {route_addrs: [10.0.0.2:9090]}\nhaproxy: {spoe: 10.0.0.2:9091}\n", HAProxyPathSPOE, "", DefaultRouteBody},
		{"explicit lua", base + "haproxy: {path: lua}\n", HAProxyPathLua, "", DefaultRouteBody},
		{"explicit spoe, remote turnouts, no agent", base + "proxy: {route_addrs: [10.0.0.2:9090]}\nhaproxy: {path: spoe}\n", "", "haproxy.spoe", 0},
		{"unknown path", base + "haproxy: {path: grpc}\n", "", "haproxy.path", 0},
		{"small max_body", base + "max_body: 4096\n", HAProxyPathSPOE, "", 4096},
		{"route_body above max_body", base + "max_body: 65536\nroute_body: 65537\n", "", "route_body", 0},
		{"route_body too small", base + "route_body: 100\n", "", "route_body", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tc.yaml))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.HAProxy.Path != tc.path || cfg.RouteBody != tc.routeBody {
				t.Errorf("path %q route_body %d, want %q %d", cfg.HAProxy.Path, cfg.RouteBody, tc.path, tc.routeBody)
			}
		})
	}
}
