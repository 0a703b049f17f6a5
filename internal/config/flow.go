package config

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// FlowConfig is a deployment's flow control: while its serving
// pool is saturated, decisions are held in turnout, by class (strict
// priority, in the order of Classes) and tenant (round robin within a
// class), and released as capacity frees. nil: off, every request is
// decided at once.
type FlowConfig struct {
	// PriorityHeader carries the class (a class name or one of its
	// Values); matched like session_headers (case, '-'/'_'). Read only
	// when Trust.PriorityHeader says the proxy's own rules set it.
	PriorityHeader string `yaml:"priority_header"`
	// TenantHeader names the tenant for fairness; read only when
	// Trust.TenantHeader says the proxy's own rules set it.
	TenantHeader string `yaml:"tenant_header"`
	// SLOHeader carries a request's time-to-first-token objective in
	// milliseconds (route/flow/slo.go); read only when Trust.SLOHeader
	// says the proxy's own rules set it. Without it a request's objective
	// is its class's TTFTSLO.
	SLOHeader string `yaml:"slo_header"`
	// TenantAPIKey: the tenant is the TenantKeys entry of the request's
	// Authorization value (forwarded to turnout).
	TenantAPIKey bool `yaml:"tenant_api_key"`
	// TenantKeys maps the SHA-256 (64 hex digits) of an Authorization
	// value ("Bearer sk-...") to its tenant's name. A request whose key is
	// not listed, like one without a trusted tenant, is in the shared
	// tenant: a client that invents a key (or tenant) per request gets one
	// turn of the round robin, not one per invention.
	TenantKeys map[string]string `yaml:"tenant_keys"`
	// Trust says which flow headers come from a source the operator
	// controls. Untrusted (the default), the rendered proxy configs strip
	// the header from client requests and turnout ignores it: the class is
	// the model's default and the tenant comes from TenantKeys or is shared.
	Trust FlowTrust `yaml:"trust"`
	// DefaultClass is the class of a request without (or with an unknown)
	// priority; ModelClasses set it per model name.
	DefaultClass string            `yaml:"default_class"`
	ModelClasses map[string]string `yaml:"model_classes"`
	// Classes, highest priority first (default critical, standard,
	// sheddable).
	Classes []FlowClass `yaml:"classes"`
	// Saturation says when the pool is full.
	Saturation FlowSaturation `yaml:"saturation"`
	// MaxTenantLabels bounds the tenant label of the metrics: the first
	// ones seen get their own, the rest are "other".
	MaxTenantLabels int `yaml:"max_tenant_labels"`
}

// FlowTrust marks flow headers as set by the operator (an ingress in
// front of the proxy, an auth layer), not by clients.
type FlowTrust struct {
	PriorityHeader bool `yaml:"priority_header"`
	TenantHeader   bool `yaml:"tenant_header"`
	SLOHeader      bool `yaml:"slo_header"`
}

// TenantKeyHashLen is the length of a tenant_keys key: hex SHA-256.
const TenantKeyHashLen = 64

// FlowClass is one priority class.
type FlowClass struct {
	Name string `yaml:"name"`
	// Values are the priority header values meaning this class (besides
	// its name), compared without case.
	Values []string `yaml:"values"`
	// MaxQueue bounds the requests held in this class; MaxWait how long one
	// is held.
	MaxQueue int      `yaml:"max_queue"`
	MaxWait  Duration `yaml:"max_wait"`
	// Shed: past MaxWait or MaxQueue the request is refused (429 with
	// Retry-After). Otherwise it is routed at once, into the engines' own
	// queues: held no longer, never refused.
	Shed bool `yaml:"shed"`
	// Headroom is how far past saturation.max_load and max_waiting (per
	// endpoint) this class may still be admitted: a reserve that lower
	// classes never fill, so this class rarely waits for a completion.
	// Not larger than the headroom of any class above.
	Headroom int `yaml:"headroom"`
	// TTFTSLO is the class's time-to-first-token objective (0: none): the
	// objective of its requests without a trusted SLO header. Routing
	// picks a replica predicted to meet it; a shedding class's request
	// predicted to miss it on every replica is shed.
	TTFTSLO Duration `yaml:"ttft_slo"`
}

// FlowSaturation: an endpoint has room while under every set threshold;
// the pool is saturated when no available endpoint has room. Zero: unset.
type FlowSaturation struct {
	// MaxLoad bounds the engine's running + waiting requests, moved by
	// turnout's own in-flight changes since the scrape (fleet's Load).
	MaxLoad int `yaml:"max_load"`
	// MaxWaiting bounds the engine-reported waiting requests, moved the
	// same way (needs engine_load scraping).
	MaxWaiting int `yaml:"max_waiting"`
	// MaxKVUsage bounds the engine's KV-cache usage in (0, 1].
	MaxKVUsage float64 `yaml:"max_kv_usage"`
}

// Flow control defaults.
const (
	FlowClassCritical  = "critical"
	FlowClassStandard  = "standard"
	FlowClassSheddable = "sheddable"
	defaultPriorityHdr = "x-priority"
	defaultTenantHdr   = "x-tenant-id"
	defaultSLOHdr      = "x-slo-ttft-ms"
	// MaxTTFTSLO bounds an objective, the class's or a header's.
	MaxTTFTSLO = 10 * time.Minute
	// MaxFlowWait bounds any class's max_wait: the proxies' call timeouts
	// grow with it (RouteCallTimeout).
	MaxFlowWait = 5 * time.Minute
)

// ApplyDefaults fills what the config leaves out (Config.Validate does it for a loaded file).
func (f *FlowConfig) ApplyDefaults() {
	orDefault(&f.PriorityHeader, defaultPriorityHdr)
	orDefault(&f.TenantHeader, defaultTenantHdr)
	orDefault(&f.SLOHeader, defaultSLOHdr)
	if len(f.Classes) == 0 {
		f.Classes = []FlowClass{
			{Name: FlowClassCritical, MaxQueue: 1000, MaxWait: Duration(30 * time.Second)},
			{Name: FlowClassStandard, MaxQueue: 1000, MaxWait: Duration(10 * time.Second)},
			{Name: FlowClassSheddable, MaxQueue: 200, MaxWait: Duration(2 * time.Second), Shed: true},
		}
	}
	for i := range f.Classes {
		c := &f.Classes[i]
		orDefault(&c.MaxQueue, 1000)
		orDefault(&c.MaxWait, Duration(10*time.Second))
	}
	if f.DefaultClass == "" {
		f.DefaultClass = FlowClassStandard
		if f.ClassIndex(FlowClassStandard) < 0 {
			f.DefaultClass = f.Classes[len(f.Classes)/2].Name
		}
	}
	orDefault(&f.MaxTenantLabels, 20)
}

// ClassIndex is the position of the class named (or valued) s, without
// case; -1 when none.
func (f *FlowConfig) ClassIndex(s string) int {
	for i := range f.Classes {
		c := &f.Classes[i]
		if strings.EqualFold(c.Name, s) {
			return i
		}
		for _, v := range c.Values {
			if strings.EqualFold(v, s) {
				return i
			}
		}
	}
	return -1
}

// MaxHold is the longest any class holds a request (0: off).
func (f *FlowConfig) MaxHold() time.Duration {
	var m time.Duration
	if f == nil {
		return 0
	}
	for i := range f.Classes {
		m = max(m, f.Classes[i].MaxWait.D())
	}
	return m
}

func (f *FlowConfig) validate(p string, bad func(field, format string, a ...any)) {
	for _, h := range []struct{ field, v string }{{"priority_header", f.PriorityHeader}, {"tenant_header", f.TenantHeader}, {"slo_header", f.SLOHeader}} {
		if !HeaderRe.MatchString(h.v) {
			bad(p+"."+h.field, "%q is not a header name", h.v)
		}
	}
	if f.TenantAPIKey && len(f.TenantKeys) == 0 {
		bad(p+".tenant_keys", "tenant_api_key needs tenant_keys (hex SHA-256 of an Authorization value -> tenant): every key not listed shares one tenant")
	}
	keys := make([]string, 0, len(f.TenantKeys))
	for k := range f.TenantKeys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if _, err := hex.DecodeString(k); err != nil || len(k) != TenantKeyHashLen {
			bad(p+".tenant_keys", "%q is not a hex SHA-256 (64 digits; printf 'Bearer sk-...' | sha256sum)", k)
		}
		if n := f.TenantKeys[k]; n == "" || len(n) > 64 {
			bad(p+".tenant_keys."+k, "tenant name empty or longer than 64")
		}
	}
	if len(f.Classes) > 8 {
		bad(p+".classes", "%d classes: at most 8", len(f.Classes))
	}
	seen := map[string]string{}
	for i := range f.Classes {
		c := &f.Classes[i]
		cf := fmt.Sprintf("%s.classes[%d]", p, i)
		if !NameRe.MatchString(c.Name) {
			bad(cf+".name", "%s", nameProblem(c.Name))
		}
		for _, v := range append([]string{c.Name}, c.Values...) {
			k := strings.ToLower(v)
			if other, dup := seen[k]; dup {
				bad(cf, "%q already names class %s", v, other)
			}
			seen[k] = c.Name
		}
		if c.MaxQueue < 0 || c.MaxQueue > 1_000_000 {
			bad(cf+".max_queue", "%d out of range [0, 1000000]", c.MaxQueue)
		}
		if w := c.MaxWait.D(); w < 0 || w > MaxFlowWait {
			bad(cf+".max_wait", "%v out of range (0, %v]", w, MaxFlowWait)
		}
		if c.Headroom < 0 || (i > 0 && c.Headroom > f.Classes[i-1].Headroom) {
			bad(cf+".headroom", "%d: must be at least 0 and at most the headroom of the class above", c.Headroom)
		}
		if s := c.TTFTSLO.D(); s < 0 || s > MaxTTFTSLO {
			bad(cf+".ttft_slo", "%v out of range [0, %v]", s, MaxTTFTSLO)
		}
		if c.Shed && i == 0 {
			// The highest class is the one flow control protects.
			bad(cf+".shed", "the highest-priority class is never shed")
		}
	}
	if f.ClassIndex(f.DefaultClass) < 0 {
		bad(p+".default_class", "%q is not a class", f.DefaultClass)
	}
	models := make([]string, 0, len(f.ModelClasses))
	for m := range f.ModelClasses {
		models = append(models, m)
	}
	slices.Sort(models)
	for _, m := range models {
		if f.ClassIndex(f.ModelClasses[m]) < 0 {
			bad(p+".model_classes."+m, "%q is not a class", f.ModelClasses[m])
		}
	}
	s := &f.Saturation
	if s.MaxLoad < 0 || s.MaxWaiting < 0 || s.MaxKVUsage < 0 || s.MaxKVUsage > 1 {
		bad(p+".saturation", "thresholds must be positive (max_kv_usage at most 1)")
	}
	if s.MaxLoad == 0 && s.MaxWaiting == 0 && s.MaxKVUsage == 0 {
		bad(p+".saturation", "set max_load, max_waiting or max_kv_usage: without one the pool is never saturated")
	}
	if f.MaxTenantLabels < 0 || f.MaxTenantLabels > 1000 {
		bad(p+".max_tenant_labels", "%d out of range [1, 1000]", f.MaxTenantLabels)
	}
}

// firstFlow is the first deployment's flow config (nil: none has one).
func firstFlow(c *Config) *FlowConfig {
	for i := range c.Deployments {
		if f := c.Deployments[i].FlowControl; f != nil {
			return f
		}
	}
	return nil
}

// sameFlowHeaders reports whether a and b read the same headers alike.
func sameFlowHeaders(a, b *FlowConfig) bool {
	return strings.EqualFold(a.PriorityHeader, b.PriorityHeader) && strings.EqualFold(a.TenantHeader, b.TenantHeader) && strings.EqualFold(a.SLOHeader, b.SLOHeader) && a.Trust == b.Trust
}

// UntrustedFlowHeaders are the flow headers of c that no proxy rule
// vouches for: the rendered configs strip them from client requests.
func UntrustedFlowHeaders(c *Config) []string {
	f := firstFlow(c)
	if f == nil {
		return nil
	}
	var out []string
	if !f.Trust.PriorityHeader {
		out = append(out, strings.ToLower(f.PriorityHeader))
	}
	if !f.Trust.TenantHeader {
		out = append(out, strings.ToLower(f.TenantHeader))
	}
	if !f.Trust.SLOHeader {
		out = append(out, strings.ToLower(f.SLOHeader))
	}
	return out
}
