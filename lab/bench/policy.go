package bench

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/turnout/turnout/route/policy"
)

// Routers that model a proxy balancing on its own, without turnout. In the
// sim the nginx rows use the same models as the HAProxy ones (round robin;
// least connections with ties taken in rotation); e2e runs the real proxy.
const (
	HAProxyRoundRobin = "haproxy-roundrobin"
	HAProxyLeastConn  = "haproxy-leastconn"
	NginxRoundRobin   = "nginx-roundrobin"
	NginxLeastConn    = "nginx-leastconn"
)

// Proxies a turnout stack can sit behind in e2e runs. ProxyEPP is no
// proxy process: the replay's driver is an Envoy-like gateway
// (EnvoyGateway) and turnout its Endpoint Picker.
const (
	ProxyHAProxy = "haproxy"
	ProxyNginx   = "nginx"
	ProxyEPP     = "epp"
)

// ParseProxies reads a comma-separated list of seats for the replay's
// turnout policies (haproxy, nginx, epp), each named once.
func ParseProxies(s string) ([]string, error) {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		switch {
		case p != ProxyHAProxy && p != ProxyNginx && p != ProxyEPP:
			return nil, fmt.Errorf("proxy %q in %q: want haproxy, nginx or epp", p, s)
		case slices.Contains(out, p):
			return nil, fmt.Errorf("proxy %q named twice in %q", p, s)
		}
		out = append(out, p)
	}
	return out, nil
}

// PolicyLevelKey is the spec key written beside the policy's name rather
// than among its params: "prefix-affinity:max_candidates=128".
const PolicyLevelKey = "max_candidates"

// Param is one policy parameter, kept in the order given.
type Param struct{ Key, Value string }

// PolicySpec names a router: a turnout policy with parameters, or one of the
// HAProxy-alone models.
type PolicySpec struct {
	Policy string
	Params []Param
}

// paramRe keeps spec values to plain YAML scalars, so a spec cannot inject
// structure into the generated config.
var (
	paramKeyRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)
	paramValRe = regexp.MustCompile(`^[A-Za-z0-9.+-]{1,40}$`)
	policyRe   = regexp.MustCompile(`^[a-z][a-z0-9-]{0,40}$`)
)

// ParsePolicySpec reads "name" or "name:key=value,key=value".
func ParsePolicySpec(s string) (PolicySpec, error) {
	name, rest, hasParams := strings.Cut(strings.TrimSpace(s), ":")
	if !policyRe.MatchString(name) {
		return PolicySpec{}, fmt.Errorf("policy spec %q: bad policy name", s)
	}
	ps := PolicySpec{Policy: name}
	if !hasParams {
		return ps, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || !paramKeyRe.MatchString(k) || !paramValRe.MatchString(v) {
			return PolicySpec{}, fmt.Errorf("policy spec %q: bad parameter %q (want key=value)", s, kv)
		}
		ps.Params = append(ps.Params, Param{k, v})
	}
	if ps.IsProxyAlone() {
		return PolicySpec{}, fmt.Errorf("policy spec %q: %s takes no parameters", s, name)
	}
	return ps, nil
}

// ParsePolicySpecs reads a ';'-separated list of specs.
func ParsePolicySpecs(s string) ([]PolicySpec, error) {
	var out []PolicySpec
	for _, part := range strings.Split(s, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		ps, err := ParsePolicySpec(part)
		if err != nil {
			return nil, err
		}
		out = append(out, ps)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policy in %q", s)
	}
	return out, nil
}

// String is the spec as ParsePolicySpec reads it; it labels table rows.
func (p PolicySpec) String() string {
	if len(p.Params) == 0 {
		return p.Policy
	}
	var b strings.Builder
	b.WriteString(p.Policy)
	for i, kv := range p.Params {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(kv.Key + "=" + kv.Value)
	}
	return b.String()
}

// IsHAProxy reports whether the spec is HAProxy balancing alone.
func (p PolicySpec) IsHAProxy() bool {
	return p.Policy == HAProxyRoundRobin || p.Policy == HAProxyLeastConn
}

// IsNginx reports whether the spec is nginx balancing alone.
func (p PolicySpec) IsNginx() bool {
	return p.Policy == NginxRoundRobin || p.Policy == NginxLeastConn
}

// IsProxyAlone reports whether the spec is a proxy without turnout.
func (p PolicySpec) IsProxyAlone() bool { return p.IsHAProxy() || p.IsNginx() }

// Proxy returns the proxy a row runs behind in e2e: a proxy-alone spec names
// its own; turnout policies go behind def.
func (p PolicySpec) Proxy(def string) string {
	switch {
	case p.IsHAProxy():
		return ProxyHAProxy
	case p.IsNginx():
		return ProxyNginx
	}
	return def
}

// DefaultPolicies lists the comparison rows: HAProxy alone, then every
// turnout policy the registry knows (kv-aware joins once it is registered).
func DefaultPolicies() []PolicySpec {
	out := []PolicySpec{{Policy: HAProxyRoundRobin}, {Policy: HAProxyLeastConn}}
	known := map[string]bool{}
	for _, n := range policy.DefaultRegistry().Names() {
		known[n] = true
	}
	for _, n := range []string{policy.RoundRobinType, policy.LeastRequestType, policy.SessionHashType, policy.PrefixAffinityType, "kv-aware"} {
		if known[n] {
			out = append(out, PolicySpec{Policy: n})
			delete(known, n)
		}
	}
	for _, n := range policy.DefaultRegistry().Names() {
		if known[n] { // policies added later than this list
			out = append(out, PolicySpec{Policy: n})
		}
	}
	return out
}

// DefaultPoliciesFor is DefaultPolicies with the proxy-alone rows of proxy
// (haproxy or nginx), so an e2e run compares turnout with the proxy it sits
// behind.
func DefaultPoliciesFor(proxy string) []PolicySpec {
	out := DefaultPolicies()
	if proxy != ProxyNginx {
		return out
	}
	for i := range out {
		switch out[i].Policy {
		case HAProxyRoundRobin:
			out[i].Policy = NginxRoundRobin
		case HAProxyLeastConn:
			out[i].Policy = NginxLeastConn
		}
	}
	return out
}

// Endpoint is one replica in a generated turnout config.
type Endpoint struct {
	Name, Address string
	// KVEvents is the replica's KV event publisher ("" = none).
	KVEvents string
}

// ConfigOptions describe a generated turnout config.
type ConfigOptions struct {
	Listen string
	Model  string
	Policy PolicySpec
	// ExtraParams are YAML flow-map entries appended to the policy params
	// (generated by the bench, never from user input).
	ExtraParams   string
	Endpoints     []Endpoint
	Syslog        string // feedback address ("" = turnout's default, route.DefaultFeedbackAddr)
	HAProxyListen string
	HAProxyDir    string
	HAProxySocket string
	// HAProxySPOE makes HAProxy ask turnout over SPOE at this address.
	HAProxySPOE string
	// HAProxyPath is haproxy.path ("" = turnout's default).
	HAProxyPath string
	// L7Retries sets haproxy.l7_retries: true (retry before bytes).
	L7Retries bool
	// HAProxyFeedback is haproxy.feedback ("" = turnout's default).
	HAProxyFeedback string
	// HAProxyNbthread is haproxy.nbthread (0 = HAProxy's default).
	HAProxyNbthread int
	// RouteBody is route_body (0 = turnout's default).
	RouteBody int
	// NoFirstTokenTiming sets proxy.first_token_timing: false.
	NoFirstTokenTiming bool
	// NginxListen, NginxDir and NginxMode fill the nginx section that
	// `turnout render nginx` reads ("" = no section).
	NginxListen    string
	NginxDir       string
	NginxMode      string
	DisableHealth  bool
	MaxBody        int
	SessionHeaders []string
	// DeploymentYAML are extra lines of the deployment (indented as its
	// keys; e.g. flow_control), generated by the bench.
	DeploymentYAML []string
	// ClusterNATS and ClusterName fill the cluster section (sync with
	// other fronts over NATS; "" = no section).
	ClusterNATS, ClusterName string
	// EPPListen, EPPTLS and EPPServer fill the epp section (the Endpoint
	// Picker's gRPC listener, epp.tls.mode and epp.server; "" = no
	// section, turnout's default mode and server).
	EPPListen, EPPTLS, EPPServer string
	// RequestLog is a file for turnout's request log, every request ("" = off).
	RequestLog string
	// DisableEngineMetrics turns the engines' /metrics scrapes off (a
	// pool of addresses nothing listens on would fail them in the
	// background of what a bench times).
	DisableEngineMetrics bool
}

// TurnoutConfig renders a turnout YAML config with one deployment and one
// mixed pool. It is plain text so it can be written next to the results and
// rerun by hand with `turnout serve --config`.
func TurnoutConfig(o ConfigOptions) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by turnout-lab bench for policy %s.\n", o.Policy)
	fmt.Fprintf(&b, "listen: %s\n", o.Listen)
	if o.MaxBody > 0 {
		fmt.Fprintf(&b, "max_body: %d\n", o.MaxBody)
	}
	if o.RouteBody > 0 {
		fmt.Fprintf(&b, "route_body: %d\n", o.RouteBody)
	}
	if len(o.SessionHeaders) > 0 {
		fmt.Fprintf(&b, "session_headers: [%s]\n", strings.Join(o.SessionHeaders, ", "))
	}
	if o.Syslog != "" {
		fmt.Fprintf(&b, "feedback:\n  syslog: %s\n", o.Syslog)
	}
	if o.RequestLog != "" {
		fmt.Fprintf(&b, "request_log: {sample: 1, to: file, file: %q}\n", o.RequestLog)
	}
	if o.ClusterNATS != "" {
		fmt.Fprintf(&b, "cluster:\n  nats: %q\n  name: %q\n", o.ClusterNATS, o.ClusterName)
	}
	if o.DisableHealth {
		b.WriteString("health:\n  disable: true\n")
	} else {
		b.WriteString("health:\n  interval: 1s\n")
	}
	if o.DisableEngineMetrics {
		b.WriteString("engine_metrics:\n  disable: true\n")
	}
	if o.NoFirstTokenTiming {
		b.WriteString("proxy:\n  first_token_timing: false\n")
	}
	// key writes a proxy section's key when it has a value.
	key := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, "  %s: %s\n", k, v)
		}
	}
	if o.HAProxyListen != "" {
		b.WriteString("haproxy:\n")
		key("listen", o.HAProxyListen)
		key("dir", o.HAProxyDir)
		key("stats_socket", o.HAProxySocket)
		key("spoe", o.HAProxySPOE)
		key("path", o.HAProxyPath)
		key("feedback", o.HAProxyFeedback)
		if o.L7Retries {
			b.WriteString("  l7_retries: true\n")
		}
		if o.HAProxyNbthread > 0 {
			fmt.Fprintf(&b, "  nbthread: %d\n", o.HAProxyNbthread)
		}
	}
	if o.NginxListen != "" {
		b.WriteString("nginx:\n")
		key("listen", o.NginxListen)
		key("dir", o.NginxDir)
		key("mode", o.NginxMode)
	}
	if o.EPPListen != "" {
		fmt.Fprintf(&b, "epp:\n  listen: %s\n", o.EPPListen)
		if o.EPPTLS != "" {
			fmt.Fprintf(&b, "  tls: {mode: %s}\n", o.EPPTLS)
		}
		if o.EPPServer != "" {
			fmt.Fprintf(&b, "  server: %s\n", o.EPPServer)
		}
	}
	b.WriteString("deployments:\n")
	fmt.Fprintf(&b, "  - name: bench\n    models: [%q]\n", o.Model)
	fmt.Fprintf(&b, "    policy:\n      name: %s\n", o.Policy.Policy)
	var ps []string
	for _, kv := range o.Policy.Params {
		if kv.Key == PolicyLevelKey { // the policy's own key, not a param
			b.WriteString("      " + kv.Key + ": " + kv.Value + "\n")
			continue
		}
		ps = append(ps, kv.Key+": "+kv.Value)
	}
	if o.ExtraParams != "" {
		ps = append(ps, o.ExtraParams)
	}
	if len(ps) > 0 {
		b.WriteString("      params: {" + strings.Join(ps, ", ") + "}\n")
	}
	for _, l := range o.DeploymentYAML {
		b.WriteString("    " + l + "\n")
	}
	b.WriteString("    pools:\n      - role: mixed\n        endpoints:\n")
	for _, e := range o.Endpoints {
		fmt.Fprintf(&b, "          - {name: %s, address: %q", e.Name, e.Address)
		if e.KVEvents != "" {
			fmt.Fprintf(&b, ", kv_events: %q", e.KVEvents)
		}
		b.WriteString("}\n")
	}
	return []byte(b.String())
}
