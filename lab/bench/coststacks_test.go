package bench

import (
	"slices"
	"strings"
	"testing"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/config"
)

// TestProxyStacksRouteBody: --route-body adds a SPOE row per route_body
// and plain rows at the default render's and each row's tune.bufsize,
// none of them a baseline candidate; without it, no such rows.
func TestProxyStacksRouteBody(t *testing.T) {
	o := CostOptions{HAProxy: "sh", ProxyPolicy: "prefix-affinity"}
	stacks, _, err := proxyStacks(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stacks {
		if s.opts.RouteBody != 0 || strings.HasPrefix(s.dir, "plain-buf") {
			t.Fatalf("row %q without --route-body", s.name)
		}
	}
	o.RouteBodies = []int{8192, 16384, 16000}
	stacks, _, err = proxyStacks(o)
	if err != nil {
		t.Fatal(err)
	}
	var rbs, bufs []int
	for _, s := range stacks {
		if s.opts.RouteBody > 0 {
			rbs = append(rbs, s.opts.RouteBody)
		}
		if strings.HasPrefix(s.dir, "plain-buf") {
			bufs = append(bufs, s.opts.PlainBufSize)
			if s.bestOf {
				t.Fatalf("%q is a baseline candidate", s.name)
			}
		}
	}
	if !slices.Equal(rbs, o.RouteBodies) {
		t.Fatalf("route_body rows %v, want %v", rbs, o.RouteBodies)
	}
	// 16000 and 16384 round to the same buffer: one plain row for both.
	want := []int{haproxy.RouteBodyBufSize(config.DefaultRouteBody), 24 << 10, 32 << 10}
	if !slices.Equal(bufs, want) {
		t.Fatalf("plain rows at %v, want %v", bufs, want)
	}
}
