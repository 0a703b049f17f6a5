package config

import (
	"strings"
	"testing"
	"time"
)

func TestFlowControlConfig(t *testing.T) {
	base := "deployments: [{name: a, flow_control: %s, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]"
	for _, tc := range []struct {
		name, flow, want string
	}{
		{"no threshold", "{}", "flow_control.saturation"},
		{"shed highest", "{saturation: {max_load: 1}, classes: [{name: a, shed: true}, {name: b}]}", "classes[0].shed"},
		{"headroom grows", "{saturation: {max_load: 1}, classes: [{name: a}, {name: b, headroom: 1}]}", "classes[1].headroom"},
		{"duplicate value", "{saturation: {max_load: 1}, classes: [{name: a, values: [x]}, {name: b, values: [X]}]}", "already names class a"},
		{"unknown default", "{saturation: {max_load: 1}, default_class: gold}", "default_class"},
		{"unknown model class", "{saturation: {max_load: 1}, model_classes: {m: gold}}", "model_classes.m"},
		{"bad header", "{saturation: {max_load: 1}, priority_header: 'x y'}", "priority_header"},
		{"kv over 1", "{saturation: {max_kv_usage: 2}}", "flow_control.saturation"},
		{"wait too long", "{saturation: {max_load: 1}, classes: [{name: a, max_wait: 1h}]}", "classes[0].max_wait"},
		{"unknown field", "{saturation: {max_load: 1}, priority: x}", "priority"},
		{"slo too long", "{saturation: {max_load: 1}, classes: [{name: a, ttft_slo: 1h}]}", "classes[0].ttft_slo"},
		{"bad slo header", "{saturation: {max_load: 1}, slo_header: 'x y'}", "slo_header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(strings.Replace(base, "%s", tc.flow, 1)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want mention of %q", err, tc.want)
			}
		})
	}
	c, err := ParseConfig([]byte(strings.Replace(base, "%s", "{saturation: {max_load: 4}}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	f := c.Deployments[0].FlowControl
	if len(f.Classes) != 3 || f.Classes[0].Name != FlowClassCritical || !f.Classes[2].Shed || f.Classes[0].Shed || f.DefaultClass != FlowClassStandard {
		t.Fatalf("defaults: %+v", f)
	}
	if f.PriorityHeader != "x-priority" || f.TenantHeader != "x-tenant-id" || f.SLOHeader != "x-slo-ttft-ms" {
		t.Fatalf("default headers %q %q %q", f.PriorityHeader, f.TenantHeader, f.SLOHeader)
	}
	if got := UntrustedFlowHeaders(c); strings.Join(got, ",") != "x-priority,x-tenant-id,x-slo-ttft-ms" {
		t.Fatalf("untrusted flow headers %v", got)
	}
	slo, err := ParseConfig([]byte(strings.Replace(base, "%s", "{saturation: {max_load: 4}, trust: {slo_header: true}, classes: [{name: critical, ttft_slo: 1s}, {name: batch, shed: true}]}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if sf := slo.Deployments[0].FlowControl; sf.Classes[0].TTFTSLO.D() != time.Second || sf.Classes[1].TTFTSLO != 0 || !sf.Trust.SLOHeader {
		t.Fatalf("ttft_slo: %+v", sf)
	}
	// The proxies' call timeouts outlast the longest hold.
	if got, want := c.RouteCallTimeout(), c.Proxy.RouteTimeout.D()+30*time.Second+time.Second; got != want {
		t.Fatalf("RouteCallTimeout %v, want %v", got, want)
	}
	off, err := ParseConfig([]byte("deployments: [{name: a, pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	if off.Deployments[0].FlowControl != nil || off.RouteCallTimeout() != off.Proxy.RouteTimeout.D() {
		t.Fatal("flow control must be off by default and leave the call timeout alone")
	}
}
