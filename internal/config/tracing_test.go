package config

import (
	"errors"
	"testing"
)

const tracingDeps = "deployments:\n  - name: a\n    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]\n"

// The tracing section: off by default, its defaults when on, and each bad
// value named with its field and line, all at once.
func TestTracingConfig(t *testing.T) {
	c := mustParse(t, tracingDeps)
	if tr := c.Tracing; tr.On() || tr.Protocol != "" || tr.ServiceName != "" {
		t.Errorf("off by default: %+v", tr)
	}
	c = mustParse(t, "tracing: {endpoint: 'otel:4317'}\n"+tracingDeps)
	if tr := c.Tracing; !tr.On() || tr.Protocol != TracingGRPC || tr.ServiceName != "turnout" || tr.Ratio() != 1 || tr.IsURL() {
		t.Errorf("defaults: %+v ratio %v", tr, tr.Ratio())
	}
	c = mustParse(t, "tracing: {endpoint: 'http://otel:4318/v1/traces', protocol: http, sample_ratio: 0, headers: {authorization: 'Bearer x'}, service_name: edge}\n"+tracingDeps)
	if tr := c.Tracing; tr.Ratio() != 0 || !tr.IsURL() || tr.Headers["authorization"] != "Bearer x" || tr.ServiceName != "edge" {
		t.Errorf("set: %+v", tr)
	}

	cases := []struct {
		yaml  string
		field string
		line  int
	}{
		{"tracing:\n  endpoint: otel:4317\n  protocol: thrift\n", "tracing.protocol", 3},
		{"tracing:\n  endpoint: otel:4317\n  sample_ratio: 1.5\n", "tracing.sample_ratio", 3},
		{"tracing:\n  endpoint: otel:4317\n  sample_ratio: -0.1\n", "tracing.sample_ratio", 3},
		{"tracing:\n  endpoint: otel\n", "tracing.endpoint", 2},
		{"tracing:\n  endpoint: 'ftp://otel:21'\n", "tracing.endpoint", 2},
		{"tracing:\n  endpoint: 'http://otel:4317/v1/traces'\n", "tracing.endpoint", 2},
		{"tracing:\n  endpoint: 'https://otel:4318'\n  protocol: http\n  insecure: true\n", "tracing.insecure", 4},
		{"tracing:\n  endpoint: otel:4317\n  headers: {'bad header': x}\n", "tracing.headers", 3},
		{"tracing:\n  endpoint: otel:4317\n  headers: {auth: \"a\\nb\"}\n", "tracing.headers", 3},
		{"tracing:\n  sample_ratio: 0.5\n", "tracing.endpoint", 0},
	}
	for _, tc := range cases {
		_, err := ParseConfig([]byte(tc.yaml + tracingDeps))
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%q: err = %v, want a ConfigError", tc.yaml, err)
			continue
		}
		found := false
		for _, p := range ce.Problems {
			if p.Path == tc.field && (tc.line == 0 || p.Line == tc.line) {
				found = true
			}
		}
		if !found {
			t.Errorf("%q: want %s at line %d, got %v", tc.yaml, tc.field, tc.line, err)
		}
	}
}

// Equal tells a changed exporter from the same one (the control loop
// rebuilds the tracer only then).
func TestTracingConfigEqual(t *testing.T) {
	half := 0.5
	a := TracingConfig{Endpoint: "otel:4317", Protocol: TracingGRPC, Headers: map[string]string{"a": "1"}}
	b := a
	b.Headers = map[string]string{"a": "1"}
	if !a.Equal(&b) {
		t.Errorf("same section unequal")
	}
	for name, mod := range map[string]func(*TracingConfig){
		"endpoint": func(c *TracingConfig) { c.Endpoint = "otel:4318" },
		"ratio":    func(c *TracingConfig) { c.SampleRatio = &half },
		"header":   func(c *TracingConfig) { c.Headers = map[string]string{"a": "2"} },
		"insecure": func(c *TracingConfig) { c.Insecure = true },
	} {
		c := a
		c.Headers = map[string]string{"a": "1"}
		mod(&c)
		if a.Equal(&c) {
			t.Errorf("%s changed, still Equal", name)
		}
	}
}
