package config

import (
	"net"
	"net/url"
	"strings"
)

// TracingConfig exports one OpenTelemetry span per decision over OTLP
// (route/tracing, docs/tracing.md), parented to the client's W3C
// traceparent. Off unless Endpoint is set.
type TracingConfig struct {
	// Endpoint is the OTLP receiver: host:port (grpc default 4317, http
	// 4318), or a URL (http://host:4318/v1/traces; https:// is TLS).
	Endpoint string `yaml:"endpoint"`
	// Protocol is grpc (default) or http (OTLP/HTTP protobuf).
	Protocol string `yaml:"protocol"`
	// SampleRatio is the fraction of decisions traced, by trace id, when the
	// client sent no traceparent (nil: 1); a client's traceparent decides by
	// its sampled flag.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// Insecure sends to a host:port endpoint without TLS.
	Insecure bool `yaml:"insecure"`
	// Headers are sent with every export (a collector's auth header).
	Headers map[string]string `yaml:"headers"`
	// ServiceName is the spans' service.name (default "turnout").
	ServiceName string `yaml:"service_name"`
}

// Tracing protocols (tracing.protocol).
const (
	TracingGRPC = "grpc"
	TracingHTTP = "http"
)

// On reports whether decisions are traced at all.
func (t *TracingConfig) On() bool { return t.Endpoint != "" }

// Ratio is SampleRatio with its default.
func (t *TracingConfig) Ratio() float64 {
	if t.SampleRatio == nil {
		return 1
	}
	return *t.SampleRatio
}

// IsURL reports whether Endpoint is a URL rather than host:port.
func (t *TracingConfig) IsURL() bool { return strings.Contains(t.Endpoint, "://") }

// Equal reports whether two tracing sections configure the same exporter.
func (t *TracingConfig) Equal(o *TracingConfig) bool {
	if t.Endpoint != o.Endpoint || t.Protocol != o.Protocol || t.Insecure != o.Insecure ||
		t.ServiceName != o.ServiceName || t.Ratio() != o.Ratio() || len(t.Headers) != len(o.Headers) {
		return false
	}
	for k, v := range t.Headers {
		if w, ok := o.Headers[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func (c *Config) applyTracingDefaults() {
	t := &c.Tracing
	if !t.On() {
		return
	}
	if t.Protocol == "" {
		t.Protocol = TracingGRPC
	}
	if t.ServiceName == "" {
		t.ServiceName = "turnout"
	}
}

func (c *Config) validateTracing(bad func(field, format string, a ...any)) {
	t := &c.Tracing
	if !t.On() {
		if t.Protocol != "" || t.SampleRatio != nil || t.Insecure || len(t.Headers) > 0 || t.ServiceName != "" {
			bad("tracing.endpoint", "is required: tracing is configured but has no endpoint (remove the section to turn tracing off)")
		}
		return
	}
	switch t.Protocol {
	case TracingGRPC, TracingHTTP:
	default:
		bad("tracing.protocol", "%q is not grpc or http", t.Protocol)
	}
	if r := t.Ratio(); r < 0 || r > 1 {
		bad("tracing.sample_ratio", "%v is not a fraction in [0, 1]", r)
	}
	if t.IsURL() {
		u, err := url.Parse(t.Endpoint)
		switch {
		case err != nil:
			bad("tracing.endpoint", "%q: %v", t.Endpoint, err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("tracing.endpoint", "%q: the scheme must be http or https", t.Endpoint)
		case u.Host == "":
			bad("tracing.endpoint", "%q has no host", t.Endpoint)
		case u.Scheme == "https" && t.Insecure:
			bad("tracing.insecure", "is set but the endpoint %q is https (use http:// for plaintext)", t.Endpoint)
		case t.Protocol == TracingGRPC && u.Path != "" && u.Path != "/":
			bad("tracing.endpoint", "%q: an OTLP/gRPC endpoint has no path", t.Endpoint)
		}
	} else if _, _, err := net.SplitHostPort(t.Endpoint); err != nil {
		bad("tracing.endpoint", "%q is not host:port or an http(s):// URL", t.Endpoint)
	}
	for k, v := range t.Headers {
		if !HeaderRe.MatchString(k) {
			bad("tracing.headers", "%q is not a header name", k)
		}
		if strings.ContainsAny(v, "\r\n") {
			bad("tracing.headers", "the value of %q has a line break", k)
		}
	}
	if strings.ContainsAny(t.ServiceName, "\r\n") {
		bad("tracing.service_name", "%q has a line break", t.ServiceName)
	}
}
