package config

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/turnout/turnout/internal/kvtopic"
)

// Roles of a pool inside a deployment.
const (
	RoleMixed   = "mixed"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Fail modes for the proxy glue when turnout cannot answer.
const (
	FailOpen   = "open"
	FailClosed = "closed"
)

// nginx routing modes per deployment.
const (
	NginxModeHeader = "header"
	NginxModeBody   = "body"
)

// Config is the whole turnout configuration file.
type Config struct {
	Listen string `yaml:"listen"`
	// AdminListen, when set, is a second HTTP listener serving only
	// /healthz, /readyz and /metrics (never /internal/*), so the kubelet
	// and Prometheus reach them while Listen stays on loopback for a
	// sidecar proxy (docs/kubernetes.md, threat model). Default: off.
	AdminListen string `yaml:"admin_listen"`
	// SessionHeaders are matched case-insensitively with '-' and '_' equivalent.
	SessionHeaders []string `yaml:"session_headers"`
	// ModelHeaders name headers that may carry the model when the body does not
	// (nginx header mode routes without a body).
	ModelHeaders []string `yaml:"model_headers"`
	// MaxBody is the largest body turnout reads whole: prefill/decode needs
	// all of it, nginx body mode holds up to this much in memory.
	MaxBody int `yaml:"max_body"`
	// RouteBody is the prefix of a body the proxies hand turnout for routing
	// (prefix-affinity and kv-aware match the start of the prompt); a longer
	// body is still forwarded whole to the replica. It sizes HAProxy's global
	// tune.bufsize (RouteBody + 16 KiB) unless a prefill/decode deployment
	// needs whole bodies: buffers above 64 KiB cost HAProxy about half its
	// throughput, on every frontend.
	RouteBody int `yaml:"route_body"`
	// DecisionTTL expires decisions whose completion never arrives.
	DecisionTTL Duration `yaml:"decision_ttl"`
	// Fallbacks is how many extra servers each decision names.
	Fallbacks int            `yaml:"fallbacks"`
	Feedback  FeedbackConfig `yaml:"feedback"`
	Health    HealthConfig   `yaml:"health"`
	Proxy     ProxyConfig    `yaml:"proxy"`
	HAProxy   HAProxyConfig  `yaml:"haproxy"`
	Nginx     NginxConfig    `yaml:"nginx"`
	// EngineMetrics scrapes each endpoint's own /metrics for its load.
	EngineMetrics EngineMetricsConfig `yaml:"engine_metrics"`
	// Cluster shares prefix decisions with other turnout instances.
	Cluster ClusterConfig `yaml:"cluster"`
	// Limits bound what clients of turnout's HTTP listener can hold.
	Limits LimitsConfig `yaml:"limits"`
	// RequestLog writes one line per request (requestlog.go).
	RequestLog RequestLogConfig `yaml:"request_log"`
	// EPP serves the Endpoint Picker Protocol to Gateway API gateways (epp.go).
	EPP EPPConfig `yaml:"epp"`
	// Tracing exports a span per decision over OTLP (tracing.go).
	Tracing TracingConfig `yaml:"tracing"`

	// Presets are named policies composed from stages (stages.go), chosen
	// by name like the built-in ones.
	Presets []PresetConfig `yaml:"presets"`

	Deployments []DeploymentConfig `yaml:"deployments"`

	// warnings found at load (accepted, but probably not what was meant).
	warnings []*FieldError
	// pos maps field paths to their lines, for problems found after parsing
	// (VerifyServedModels).
	pos positions
	// KVEventsBind, when set (tcp://0.0.0.0:5557), makes turnout bind one
	// ZMQ SUB socket that engines' KV-event publishers connect to (vLLM
	// with a concrete endpoint, llm-d); every endpoint without its own
	// kv_events is fed from it, by topic. A deployment may set its own.
	KVEventsBind string `yaml:"kv_events_bind"`
	// KVEventsTopic is the topic template attributing bound messages to
	// endpoints (default kvtopic.DefaultTemplate, "kv@{host}:{port}@{model}").
	KVEventsTopic string `yaml:"kv_events_topic"`
}

// FeedbackConfig configures completion feedback from the proxy. It is on by
// default (DefaultFeedbackAddr): the rendered proxies log each completion
// there and `turnout serve` listens.
type FeedbackConfig struct {
	// Syslog is the address proxy log lines come to, over UDP (one line or
	// more per datagram) and TCP (octet-counted or newline-framed syslog,
	// RFC 6587: haproxy.feedback: ring) (default DefaultFeedbackAddr).
	Syslog string `yaml:"syslog"`
	// Disable turns feedback off; load-aware policies then drift (warned).
	Disable bool `yaml:"disable"`
	// Sources are the IPs or CIDRs feedback lines (and /internal/done) are
	// accepted from. Default: loopback and feedback.syslog's own host.
	Sources []string `yaml:"sources"`
	// Token, when set, must appear in every feedback line (the rendered log
	// formats carry it) and in /internal/done calls (X-Turnout-Token).
	Token string `yaml:"token"`
	// TokenFile holds the feedback lines' token when Token is not set
	// (feedbacktoken.go): read, or created with a random token on first use
	// by `turnout serve` or `turnout render`, so both agree. Default
	// "feedback.token" beside the config file; "off" leaves the lines
	// unauthenticated.
	TokenFile string `yaml:"token_file"`
	// fileToken is the token read from TokenFile (LineToken).
	fileToken string
	// StalledAfter: no completion for this long while StalledMinDecisions
	// or more decisions were made means feedback is lost (warning, gauge,
	// /readyz?verbose). Default 60s and 20.
	StalledAfter        Duration `yaml:"stalled_after"`
	StalledMinDecisions int      `yaml:"stalled_min_decisions"`
}

// LimitsConfig bounds the resources the HTTP listener gives its clients, so
// slow or oversized requests cannot exhaust turnout.
type LimitsConfig struct {
	// MaxConns caps concurrent connections; more are answered 503.
	MaxConns int `yaml:"max_conns"`
	// MaxBufferedBytes caps the request body bytes held across all in-flight
	// requests; a request that would exceed it is answered 503 (overloaded).
	MaxBufferedBytes int `yaml:"max_buffered_bytes"`
	// MaxHeaderBytes is the largest request head (request line and headers)
	// accepted; larger ones are answered 431 header_too_large.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// ReadTimeout bounds reading one whole request.
	ReadTimeout Duration `yaml:"read_timeout"`
	// BodyIdleTimeout bounds the wait for each chunk of a request body.
	BodyIdleTimeout Duration `yaml:"body_idle_timeout"`
}

// HealthConfig configures turnout's own active checks of endpoints.
type HealthConfig struct {
	Path     string   `yaml:"path"`
	Interval Duration `yaml:"interval"`
	// Disable turns active checks off (e.g. tests with fake endpoints).
	Disable bool     `yaml:"disable"`
	Timeout Duration `yaml:"timeout"`
	Fails   int      `yaml:"fails"` // consecutive failures before down
	// MinReady is how many available endpoints a pool needs before its
	// models count as ready (/readyz; default 1; a pool's min_ready
	// overrides it). 0 is kept: a pool may be empty. A pointer, so an
	// explicit 0 is told apart from unset.
	MinReady *int `yaml:"min_ready"`
	// ModelsWait bounds how long /readyz waits for the first GET
	// /v1/models answer of an endpoint that passed its health check
	// (models.go; default 10s).
	ModelsWait Duration `yaml:"models_wait"`
	// Stall configures passive stall detection (stall.go).
	Stall StallConfig `yaml:"stall"`
	// ModelsInterval is how often every endpoint's GET /v1/models is asked
	// (models.go; default 10s).
	ModelsInterval Duration `yaml:"models_interval"`
}

// StallConfig configures passive stall detection: an endpoint whose
// requests wait longer than its limit for their first byte is probed with a
// 1-token completion and, if that probe also misses the limit, degraded
// (no new decisions) until a probe answers in time. The limit is Scale x
// the replica's p99 first-token time, at least Floor, at most Budget.
type StallConfig struct {
	// Budget is the most time to first byte a replica is allowed (its
	// limit while its first-token times are unknown). Default 30s,
	// for mixed and decode pools; prefill pools are not checked unless their
	// pool sets stall_budget (long prefills are normal). Disable turns
	// detection off, a pool's stall_budget: 0 off for that pool.
	Budget Duration `yaml:"budget"`
	// Scale times the replica's p99 first-token time (the proxies' tft=
	// of the last 1-2 minutes, its pool's when it has too few) is its
	// limit (default 3, at least 1).
	Scale float64 `yaml:"scale"`
	// Floor is the least limit (default 1s; a Floor at or above Budget
	// turns scaling off).
	Floor Duration `yaml:"floor"`
	// ProbePath receives the probe: POST {"model","prompt","max_tokens":1}.
	ProbePath string `yaml:"probe_path"`
	// Readmit is how often a degraded endpoint is probed again (default: Budget).
	Readmit Duration `yaml:"readmit"`
	// Disable turns stall detection off everywhere.
	Disable bool `yaml:"disable"`
}

// ProxyConfig holds settings shared by the rendered HAProxy and nginx glue.
type ProxyConfig struct {
	// RouteAddrs are the turnout addresses the proxy calls; default [Listen].
	RouteAddrs []string `yaml:"route_addrs"`
	// FailMode: open = proxy balances by itself, closed = 503.
	FailMode string `yaml:"fail_mode"`
	// ExposeAdminPaths lets clients reach the engines' admin routes under
	// /v1/ (vLLM's LoRA load and unload), which the rendered proxy configs
	// refuse by default: an adapter a client loads is loaded for everyone.
	ExposeAdminPaths bool `yaml:"expose_admin_paths"`
	// RouteTimeout bounds one call to /internal/route.
	RouteTimeout Duration `yaml:"route_timeout"`
	// BreakerFailures consecutive failures open the breaker for BreakerCooldown.
	BreakerFailures int      `yaml:"breaker_failures"`
	BreakerCooldown Duration `yaml:"breaker_cooldown"`
	// Timeouts for long generation streams.
	ConnectTimeout Duration `yaml:"connect_timeout"`
	StreamTimeout  Duration `yaml:"stream_timeout"`
	// FirstTokenTiming renders the proxies' first-token timers (HAProxy
	// rules that hold the response headers until the first body bytes, an
	// njs body filter in nginx, which then loads njs in header mode too):
	// the feedback line's tft=. Default on (nil).
	FirstTokenTiming *bool `yaml:"first_token_timing"`
}

// FirstTokenTimed reports whether the rendered proxies time the first
// response body bytes (proxy.first_token_timing, default true).
func (p *ProxyConfig) FirstTokenTimed() bool { return p.FirstTokenTiming == nil || *p.FirstTokenTiming }

// HAProxyConfig configures the rendered HAProxy.
type HAProxyConfig struct {
	Listen      string `yaml:"listen"`
	StatsSocket string `yaml:"stats_socket"`
	// Dir is where the rendered config lives (rewritten on membership changes).
	Dir string `yaml:"dir"`
	// DrainTimeout bounds how long a removed server drains before deletion.
	DrainTimeout Duration `yaml:"drain_timeout"`
	MaxConn      int      `yaml:"maxconn"`
	Nbthread     int      `yaml:"nbthread"`
	// L7Retries renders "retry-on conn-failure empty-response 503": a
	// request reset, answered with nothing or answered 503 (a replica
	// shutting down) before any byte reached the client also goes to
	// another replica. Off by default: HAProxy then retries refused
	// connections only (its own default) and keeps no copy of each request;
	// the copy is the whole 64 KiB buffer per request, half of what HAProxy
	// executes on the SPOE path (docs/haproxy.md, BENCHMARKS.md).
	L7Retries bool `yaml:"l7_retries"`
	// Feedback is how HAProxy sends its completion lines to
	// feedback.syslog: udp (default) sends one datagram per request; ring
	// writes them into a ring buffer that HAProxy forwards over one TCP
	// connection in batches (octet-counted syslog, RFC 6587). turnout
	// listens on UDP, and with ring on TCP at the same address too. The ring measured 0.94x the datagram's requests/s
	// on the SPOE path (BENCHMARKS.md set J).
	Feedback string `yaml:"feedback"`
	// SPOE is the address of turnout's SPOE agent (host:port) that HAProxy
	// asks with haproxy.path spoe: persistent pipelined connections instead
	// of the Lua action's HTTP call, about 2x the Lua path's requests/s.
	// Prefill/decode bodies are still rewritten by the Lua filter. Empty:
	// a unix socket next to the rendered files (DIR/spoe.sock), served by
	// turnout serve --haproxy-dir DIR (or haproxy.dir).
	SPOE string `yaml:"spoe"`
	// Path is how HAProxy asks turnout: spoe (the measured fastest; default
	// unless proxy.route_addrs is set without haproxy.spoe) or lua (the Lua
	// action's HTTP call through the turnout_route hop to route_addrs).
	Path string `yaml:"path"`
	// TLS terminates TLS on the frontend (proxy_front.go).
	TLS TLSConfig `yaml:"tls"`
	// User and Group run HAProxy's workers (global user/group); Chroot
	// confines them (needs User). Default: HAProxy's own (root when
	// started as root).
	User   string `yaml:"user"`
	Group  string `yaml:"group"`
	Chroot string `yaml:"chroot"`
	// Extra is verbatim lines per section (proxy_front.go).
	Extra HAProxyExtra `yaml:"extra"`
}

// How the rendered HAProxy asks turnout (haproxy.path).
const (
	HAProxyPathSPOE = "spoe"
	HAProxyPathLua  = "lua"
)

// How the rendered HAProxy sends feedback lines (haproxy.feedback).
const (
	HAProxyFeedbackRing = "ring"
	HAProxyFeedbackUDP  = "udp"
)

// DefaultRouteBody is route_body's default: with 16 KiB for headers it
// keeps HAProxy's tune.bufsize at 64 KiB, below the sizes that halve its
// throughput (what 64 KiB still costs on the SPOE path, and why the
// default stays: docs/haproxy.md, "Buffers").
const DefaultRouteBody = 48 << 10

// NginxConfig configures the rendered nginx.
type NginxConfig struct {
	Listen string `yaml:"listen"`
	Dir    string `yaml:"dir"`
	// Mode is the default per-deployment mode (header or body).
	Mode string `yaml:"mode"`
	// TLS terminates TLS on the front server (proxy_front.go).
	TLS TLSConfig `yaml:"tls"`
	// Extra is verbatim lines for the http and server blocks.
	Extra NginxExtra `yaml:"extra"`
	// DrainTimeout bounds how long an endpoint that left discovery keeps
	// its open decisions (streams) in the rendered upstream; 0: the
	// haproxy.drain_timeout default (DiscoveryDrain).
	DrainTimeout Duration `yaml:"drain_timeout"`
}

// DiscoveryDrain is how long an endpoint that left discovery stays in its
// pool for the decisions it still holds: the longer of the proxies'
// drain_timeout (haproxy's has a default; nginx's only when set).
func (c *Config) DiscoveryDrain() time.Duration {
	return max(c.HAProxy.DrainTimeout.D(), c.Nginx.DrainTimeout.D())
}

// DeploymentConfig is one model deployment with its pools.
type DeploymentConfig struct {
	Name   string       `yaml:"name"`
	Models []string     `yaml:"models"`
	Policy PolicyConfig `yaml:"policy"`
	Pools  []PoolConfig `yaml:"pools"`
	// NginxMode overrides nginx.mode for this deployment.
	NginxMode string `yaml:"nginx_mode"`
	// PD configures prefill/decode disaggregation (needs prefill and decode pools).
	PD PDConfig `yaml:"pd"`
	// KVEventsBind and KVEventsTopic override the service-wide ones.
	KVEventsBind  string `yaml:"kv_events_bind"`
	KVEventsTopic string `yaml:"kv_events_topic"`
	// FlowControl holds decisions while the pool is saturated (flow.go); nil: off.
	FlowControl *FlowConfig `yaml:"flow_control"`
	// LoRA names the adapters this deployment routes (models.go).
	LoRA LoRAConfig `yaml:"lora"`
}

// PDConfig configures prefill/decode handling.
type PDConfig struct {
	PrefillTimeout Duration `yaml:"prefill_timeout"`
	// NoPrefill: "aggregate" serves on the decode replica alone, "reject" answers 503.
	NoPrefill string `yaml:"no_prefill"`
	// SkipPrefillBelow skips the prefill hop when the decode replica is
	// estimated to miss fewer prompt bytes than this (0 = never skip).
	SkipPrefillBelow int `yaml:"skip_prefill_below"`
}

// PolicyConfig names a policy and carries its parameters.
type PolicyConfig struct {
	Name   string    `yaml:"name"`
	Params yaml.Node `yaml:"params"`
	// Stages composes the policy from stages instead (stages.go): given
	// inline, or the stages of the preset Name names.
	Stages *StagesConfig `yaml:"stages"`
	// MaxCandidates: in a pool of more endpoints, a decision scans about
	// this many candidates (the request's key holders, the least loaded,
	// a few sampled) instead of every endpoint (0: DefaultMaxCandidates).
	MaxCandidates int `yaml:"max_candidates"`
	// preset: Stages are a preset's (resolved by name).
	preset bool
	// Where it sits in the file, for the policy factory's errors.
	path string
	line int
}

// DefaultMaxCandidates is max_candidates when unset: pools of up to 64
// endpoints are scanned whole.
const DefaultMaxCandidates = 64

// Candidates is max_candidates with its default.
func (p *PolicyConfig) Candidates() int {
	return cmp.Or(p.MaxCandidates, DefaultMaxCandidates)
}

func (p *PolicyConfig) setPosition(path string, line int) { p.path, p.line = path, line }

// paramsPath names the params in errors: the config path when known.
func (p *PolicyConfig) paramsPath() string {
	if p.path == "" {
		return "policy " + p.Name + " params"
	}
	return p.path + ".params"
}

// DecodeParams decodes the policy's params strictly into dst, reporting
// unknown parameters and bad values with their path and file line.
func (p *PolicyConfig) DecodeParams(dst any) error {
	if p.Params.Kind == 0 {
		return nil
	}
	d := nodeDecoder{pos: positions{}}
	d.decode(&p.Params, reflect.ValueOf(dst).Elem(), p.paramsPath())
	if len(d.errs) > 0 {
		return &ConfigError{Problems: d.errs}
	}
	return nil
}

// paramsError places a policy factory's error at the policy's params.
// ParamsError places a policy factory's error at the params in the file
// (a *ConfigError from DecodeParams is already placed).
func (p *PolicyConfig) ParamsError(err error) error {
	var ce *ConfigError
	if errors.As(err, &ce) {
		return ce
	}
	line := p.Params.Line
	orDefault(&line, p.line)
	return &ConfigError{Problems: []*FieldError{{Path: p.paramsPath(), Line: line, Msg: err.Error()}}}
}

// UnknownPolicy is the error for a policy name no factory is registered
// under, at the name's line, suggesting the closest of known.
func (p *PolicyConfig) UnknownPolicy(known []string) error {
	path := "policy.name"
	if p.path != "" {
		path = p.path + ".name"
	}
	return &ConfigError{Problems: []*FieldError{{Path: path, Line: p.line,
		Msg: fmt.Sprintf("unknown policy %q%s (known: %s)", p.Name, suggest(p.Name, known), strings.Join(known, ", "))}}}
}

// Line is the line in the file of a field path (e.g.
// deployments[0].models[1]), else of its closest ancestor; 0 when unknown.
func (c *Config) Line(path string) int { return c.pos.lineOf(path) }

// PoolConfig is a set of endpoints with one role.
type PoolConfig struct {
	Role string `yaml:"role"`
	// Policy overrides the deployment's policy for this pool.
	Policy    *PolicyConfig    `yaml:"policy"`
	Endpoints []EndpointConfig `yaml:"endpoints"`
	// MinReady overrides health.min_ready for this pool (unset: inherit;
	// 0: the pool may be empty).
	MinReady *int `yaml:"min_ready"`
	// StallBudget overrides health.stall.budget for this pool (0 = off).
	StallBudget *Duration `yaml:"stall_budget"`
	// Discovery finds the endpoints at run time instead (a pool has one or
	// the other); see control/discovery.
	Discovery *DiscoveryConfig `yaml:"discovery"`
	// Models pins what every endpoint of the pool serves (models.go).
	Models []string `yaml:"models"`
}

// DiscoveryConfig is a pool's source of endpoints other than the file.
type DiscoveryConfig struct {
	Kubernetes *KubernetesDiscovery `yaml:"kubernetes"`
}

// KubernetesDiscovery follows discovery.k8s.io/v1 EndpointSlices.
type KubernetesDiscovery struct {
	// Namespace defaults to turnout's own namespace in a cluster, else "default".
	Namespace string `yaml:"namespace"`
	// Service selects the Service's EndpointSlices; LabelSelector selects
	// EndpointSlices by label (they carry their Service's labels). One of the two.
	Service       string `yaml:"service"`
	LabelSelector string `yaml:"label_selector"`
	// InferencePool follows the named InferencePool
	// (inference.networking.k8s.io/v1) instead of EndpointSlices: the pods
	// its spec.selector matches, one endpoint per spec.targetPorts entry.
	// Exclusive with Service and LabelSelector; needs inferencepools and
	// pods get/list/watch.
	InferencePool string `yaml:"inference_pool"`
	// Port is the slice port's name or number ("" = the slice's only port);
	// not used with InferencePool (its targetPorts give the ports).
	Port string `yaml:"port"`
	// RoleLabel names a pod label whose value puts the pod into a pool, so one
	// Service can feed the prefill and the decode pool (production-stack's
	// --prefill-model-labels/--decode-model-labels); needs pods get/list/watch.
	RoleLabel string `yaml:"role_label"`
	// RoleValues are the RoleLabel values of this pool's pods (default: the role).
	RoleValues []string `yaml:"role_values"`
	// ModelLabel names a pod label whose value is the model the pod serves
	// (production-stack's model labels): only pods serving one of the
	// deployment's models join the pool, each pinned to its model until
	// its /v1/models answers (models.go). ModelValues maps label values to
	// model names (label values cannot hold "/"); default: the value.
	ModelLabel  string            `yaml:"model_label"`
	ModelValues map[string]string `yaml:"model_values"`
	// AddressType is the slice address family used: IPv4 (default) or IPv6;
	// a dual-stack Service has one slice per family for the same pods.
	AddressType string `yaml:"address_type"`
	// VanishGrace keeps a pool's last known endpoints when every one of its
	// EndpointSlices disappears (a Service deleted and re-created by a
	// rollout or chart upgrade), until the slices return, the endpoints fail
	// health, or the grace ends (default DefaultVanishGrace; 0s: off).
	VanishGrace *Duration `yaml:"vanish_grace"`
}

// DefaultVanishGrace is discovery.kubernetes.vanish_grace's default: long
// enough for a Service's slices to be re-created, short enough that
// replicas really gone are not kept for long (health checks take them out
// sooner).
const DefaultVanishGrace = 10 * time.Second

// Grace is VanishGrace with its default applied.
func (k *KubernetesDiscovery) Grace() time.Duration {
	if k.VanishGrace == nil {
		return DefaultVanishGrace
	}
	return k.VanishGrace.D()
}

// EndpointConfig is one replica.
type EndpointConfig struct {
	Name    string `yaml:"name"`
	Address string `yaml:"address"`
	// KVEvents is the replica's vLLM KV-event ZMQ publisher (e.g. tcp://10.0.0.5:5557).
	KVEvents string `yaml:"kv_events"`
	// KVTopic is the subscription prefix in dial mode; in bind mode, the
	// topic template for this endpoint alone.
	KVTopic string `yaml:"kv_topic"`
	// KVReplay is vLLM's optional replay ROUTER socket, used to fill gaps.
	KVReplay string `yaml:"kv_replay"`
	// Weight is reserved for weighted policies; 0 means 1.
	Weight int `yaml:"weight"`
	// Draining: no new decisions, in-flight ones finish; the HAProxy server
	// is set to drain. Discovery sets it for terminating pods.
	Draining bool `yaml:"draining"`
	// Discovered marks endpoints a discovery source added (never from YAML).
	Discovered bool `yaml:"-"`
	// Models pins what this endpoint serves (models.go); discovery sets it
	// from pod labels.
	Models []string `yaml:"models"`
}

// PoolName is the HAProxy backend / nginx upstream name for a deployment pool.
func PoolName(deployment, role string) string { return deployment + "_" + role }

// Duration is a time.Duration that reads "250ms" style strings in YAML.
type Duration time.Duration

// UnmarshalYAML accepts Go duration strings with a unit. A bare number
// other than 0 is refused: "interval: 5" once meant 5 ms where the operator
// meant 5 s (1,240 health checks in 3.5 s), so the unit must be written.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if n.Kind != yaml.ScalarNode || n.Decode(&s) != nil {
		return fmt.Errorf("want %s", durationHelp)
	}
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f == 0 {
			*d = 0
			return nil
		}
		return fmt.Errorf("%q has no unit: write %ss (seconds) or %sms (milliseconds)", s, s, s)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not %s", s, durationHelp)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the Go duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Ms returns whole milliseconds.
func (d Duration) Ms() int64 { return time.Duration(d).Milliseconds() }

// Names that reach proxy configs must be plain tokens, so no config text can be injected.
var (
	NameRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	HeaderRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)
)

// ErrConfig marks configuration errors.
var ErrConfig = errors.New("invalid config")

// LoadConfigFile reads, defaults and validates a config file; checks (the
// policy factories, say) run on it too and their problems join the others.
// A feedback token file that does not exist yet is created
// (feedbacktoken.go).
func LoadConfigFile(path string, checks ...func(*Config) error) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parseFile(b, path, filepath.Dir(path), true, checks)
}

// ReadConfig is LoadConfigFile for a command that writes nothing (turnout
// check), on config bytes b named file in problems: a feedback token file
// (relative paths from dir) is read when it exists and never created.
func ReadConfig(b []byte, file, dir string, checks ...func(*Config) error) (*Config, error) {
	return parseFile(b, file, dir, false, checks)
}

func parseFile(b []byte, file, dir string, create bool, checks []func(*Config) error) (*Config, error) {
	c, err := ParseConfig(b, checks...)
	var ce *ConfigError
	if errors.As(err, &ce) {
		ce.File = file
	}
	if err != nil {
		return c, err
	}
	if err := c.resolveFeedbackToken(dir, create); err != nil {
		return nil, err
	}
	return c, nil
}

// ParseConfig parses YAML strictly, applies defaults, validates and runs
// checks. Every problem comes back at once: a field that failed to decode
// keeps its default and the rest is still validated and checked (problems
// about a field that already failed to decode are not repeated).
func ParseConfig(b []byte, checks ...func(*Config) error) (*Config, error) {
	var c Config
	pos, err := decodeConfigYAML(b, &c)
	if pos == nil {
		return nil, err // not YAML, or empty: nothing to validate
	}
	var decodeErr *ConfigError
	errors.As(err, &decodeErr)
	c.ApplyDefaults()
	errs := []error{}
	if decodeErr != nil {
		errs = append(errs, decodeErr)
	}
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, check := range checks {
		if err := check(&c); err != nil {
			errs = append(errs, err)
		}
	}
	if ce := AsError(errs); ce != nil {
		ce.Problems = withoutRepeats(ce.Problems, decodeErr)
		pos.annotate(ce)
		return nil, ce
	}
	c.warnings = append(c.checkWarnings(), c.warnings...) // the checks' (AddWarning) last
	pos.annotate(&ConfigError{Problems: c.warnings})
	c.pos = pos
	return &c, nil
}

// withoutRepeats drops later problems about a field (or a field inside one)
// that already failed to decode: its default is what was validated.
func withoutRepeats(ps []*FieldError, decoded *ConfigError) []*FieldError {
	if decoded == nil {
		return ps
	}
	failed := map[*FieldError]bool{}
	for _, p := range decoded.Problems {
		failed[p] = true
	}
	out := ps[:0:0]
	for _, p := range ps {
		repeat := false
		if !failed[p] {
			for _, d := range decoded.Problems {
				if d.Path != "" && (p.Path == d.Path || strings.HasPrefix(p.Path, d.Path+".") || strings.HasPrefix(p.Path, d.Path+"[")) {
					repeat = true
					break
				}
			}
		}
		if !repeat {
			out = append(out, p)
		}
	}
	return out
}

// ApplyDefaults fills unset fields.
func (c *Config) ApplyDefaults() {
	c.HAProxy.TLS.applyDefaults()
	c.Nginx.TLS.applyDefaults()
	orDefault(&c.Listen, "127.0.0.1:9090")
	if len(c.SessionHeaders) == 0 {
		c.SessionHeaders = []string{"x-session-id"}
	}
	if c.ModelHeaders == nil {
		c.ModelHeaders = []string{"x-model"}
	}
	orDefault(&c.MaxBody, 256<<10)
	orDefault(&c.RouteBody, min(DefaultRouteBody, c.MaxBody))
	orDefault(&c.DecisionTTL, Duration(10*time.Minute))
	orDefault(&c.Fallbacks, 2)
	l := &c.Limits
	orDefault(&l.MaxConns, 4096)
	orDefault(&l.MaxBufferedBytes, 64<<20)
	orDefault(&l.MaxHeaderBytes, 32<<10)
	orDefault(&l.ReadTimeout, Duration(10*time.Second))
	orDefault(&l.BodyIdleTimeout, Duration(2*time.Second))
	if c.Feedback.Syslog == "" && !c.Feedback.Disable {
		c.Feedback.Syslog = DefaultFeedbackAddr
	}
	orDefault(&c.Health.Path, "/health")
	orDefault(&c.Health.Interval, Duration(5*time.Second))
	orDefault(&c.Health.Timeout, Duration(time.Second))
	orDefault(&c.Health.Fails, 2)
	if c.Health.MinReady == nil {
		one := 1
		c.Health.MinReady = &one
	}
	c.applyFeedbackDefaults()
	c.applyRequestLogDefaults()
	c.applyEPPDefaults()
	c.applyTracingDefaults()
	p := &c.Proxy
	if c.HAProxy.Path == "" {
		// SPOE by default, on a local socket; a config that sends the proxy
		// to other turnouts (route_addrs) without an agent address keeps
		// the Lua path, which reaches them.
		c.HAProxy.Path = HAProxyPathLua
		if len(p.RouteAddrs) == 0 || c.HAProxy.SPOE != "" {
			c.HAProxy.Path = HAProxyPathSPOE
		}
	}
	if len(p.RouteAddrs) == 0 {
		p.RouteAddrs = []string{c.Listen}
	}
	if c.HAProxy.Feedback == "" {
		c.HAProxy.Feedback = HAProxyFeedbackUDP
	}
	orDefault(&p.FailMode, FailOpen)
	orDefault(&p.RouteTimeout, Duration(500*time.Millisecond))
	orDefault(&p.BreakerFailures, 3)
	orDefault(&p.BreakerCooldown, Duration(5*time.Second))
	orDefault(&p.ConnectTimeout, Duration(2*time.Second))
	orDefault(&p.StreamTimeout, Duration(10*time.Minute))
	orDefault(&c.HAProxy.Listen, "127.0.0.1:8080")
	orDefault(&c.HAProxy.DrainTimeout, Duration(30*time.Second))
	orDefault(&c.HAProxy.MaxConn, 4096)
	orDefault(&c.Nginx.Listen, "127.0.0.1:8081")
	orDefault(&c.Nginx.Mode, NginxModeBody)
	c.applyLoadDefaults()
	for i := range c.Deployments {
		d := &c.Deployments[i]
		if d.Policy.Name == "" && d.Policy.Stages != nil {
			d.Policy.Name = CustomPolicy
		}
		orDefault(&d.Policy.Name, "least-request")
		orDefault(&d.NginxMode, c.Nginx.Mode)
		orDefault(&d.PD.PrefillTimeout, Duration(30*time.Second))
		orDefault(&d.PD.NoPrefill, "aggregate")
		if d.FlowControl != nil {
			d.FlowControl.ApplyDefaults()
		}
		for j := range d.Pools {
			if d.Pools[j].Role == "" {
				d.Pools[j].Role = RoleMixed
			}
			if p := d.Pools[j].Policy; p != nil && p.Name == "" && p.Stages != nil {
				p.Name = CustomPolicy
			}
		}
	}
}

// Validate checks the config and names the offending field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, &FieldError{Path: field, Msg: fmt.Sprintf(format, a...)})
	}
	checkAddr := func(field, a string) {
		if _, _, err := net.SplitHostPort(a); err != nil {
			bad(field, "%q is not host:port", a)
		}
	}
	checkAddr("listen", c.Listen)
	if c.AdminListen != "" {
		checkAddr("admin_listen", c.AdminListen)
		if c.AdminListen == c.Listen {
			bad("admin_listen", "%q is listen's address: the admin listener needs its own port", c.AdminListen)
		}
	}
	for i, h := range c.SessionHeaders {
		if !HeaderRe.MatchString(h) {
			bad(fmt.Sprintf("session_headers[%d]", i), "%q is not a header name", h)
		}
	}
	for i, h := range c.ModelHeaders {
		if !HeaderRe.MatchString(h) {
			bad(fmt.Sprintf("model_headers[%d]", i), "%q is not a header name", h)
		}
	}
	if c.MaxBody < 1024 || c.MaxBody > 64<<20 {
		bad("max_body", "%d out of range [1024, 64MiB]", c.MaxBody)
	}
	if c.RouteBody < 1024 || c.RouteBody > c.MaxBody {
		bad("route_body", "%d out of range [1024, max_body %d]", c.RouteBody, c.MaxBody)
	}
	if l := &c.Limits; l.MaxConns < 1 {
		bad("limits.max_conns", "%d must be at least 1", l.MaxConns)
	}
	if c.Limits.MaxBufferedBytes < c.MaxBody {
		bad("limits.max_buffered_bytes", "%d is below max_body (%d): no request could be read", c.Limits.MaxBufferedBytes, c.MaxBody)
	}
	if h := c.Limits.MaxHeaderBytes; h < 16<<10 || h > 1<<20 {
		bad("limits.max_header_bytes", "%d out of range [16KiB, 1MiB]", h)
	}
	if c.Limits.ReadTimeout.D() < 100*time.Millisecond {
		bad("limits.read_timeout", "%v is below 100ms", c.Limits.ReadTimeout.D())
	}
	if d := c.Limits.BodyIdleTimeout.D(); d < 10*time.Millisecond || d > c.Limits.ReadTimeout.D() {
		bad("limits.body_idle_timeout", "%v must be between 10ms and limits.read_timeout", d)
	}
	if c.Fallbacks < 0 || c.Fallbacks > 8 {
		bad("fallbacks", "%d out of range [0, 8]", c.Fallbacks)
	}
	switch {
	case c.Feedback.Disable && c.Feedback.Syslog != "":
		bad("feedback", "disable and syslog %q both set", c.Feedback.Syslog)
	case c.Feedback.Syslog != "":
		checkAddr("feedback.syslog", c.Feedback.Syslog)
	}
	if m := c.Health.MinReady; m != nil && (*m < 0 || *m > 10000) {
		bad("health.min_ready", "%d out of range [0, 10000] (0: a pool may be empty)", *m)
	}
	c.validateFeedback(bad)
	c.validateRequestLog(bad)
	c.validateEPP(bad)
	c.validateTracing(bad)
	if !strings.HasPrefix(c.Health.Path, "/") || strings.ContainsAny(c.Health.Path, " \t\r\n\"'") {
		bad("health.path", "%q is not an absolute path", c.Health.Path)
	}
	for i, a := range c.Proxy.RouteAddrs {
		checkAddr(fmt.Sprintf("proxy.route_addrs[%d]", i), a)
	}
	if c.Proxy.FailMode != FailOpen && c.Proxy.FailMode != FailClosed {
		bad("proxy.fail_mode", "%q must be open or closed", c.Proxy.FailMode)
	}
	checkAddr("haproxy.listen", c.HAProxy.Listen)
	if c.HAProxy.SPOE != "" {
		checkAddr("haproxy.spoe", c.HAProxy.SPOE)
	}
	switch c.HAProxy.Path {
	case HAProxyPathSPOE:
		// The default agent socket lives next to this turnout; standby
		// turnouts elsewhere need an agent address HAProxy can reach.
		if c.HAProxy.SPOE == "" && (len(c.Proxy.RouteAddrs) != 1 || c.Proxy.RouteAddrs[0] != c.Listen) {
			bad("haproxy.spoe", "required with haproxy.path spoe when proxy.route_addrs names other turnouts (or set haproxy.path: lua)")
		}
	case HAProxyPathLua:
	default:
		bad("haproxy.path", "%q must be spoe or lua", c.HAProxy.Path)
	}
	if f := c.HAProxy.Feedback; f != HAProxyFeedbackRing && f != HAProxyFeedbackUDP {
		bad("haproxy.feedback", "%q must be ring or udp", f)
	}
	checkAddr("nginx.listen", c.Nginx.Listen)
	for _, f := range []struct{ field, v string }{{"haproxy.stats_socket", c.HAProxy.StatsSocket}, {"haproxy.dir", c.HAProxy.Dir}, {"nginx.dir", c.Nginx.Dir}} {
		if strings.ContainsAny(f.v, " \t\r\n\"'#;{}") {
			bad(f.field, "%q has characters a proxy config cannot carry", f.v)
		}
	}
	if c.Nginx.Mode != NginxModeHeader && c.Nginx.Mode != NginxModeBody {
		bad("nginx.mode", "%q must be header or body", c.Nginx.Mode)
	}
	if c.Nginx.DrainTimeout < 0 {
		bad("nginx.drain_timeout", "%v must not be negative", c.Nginx.DrainTimeout.D())
	}
	c.validateLoad(bad)
	c.validateFront(bad)
	if len(c.Deployments) == 0 {
		bad("deployments", "at least one deployment is required")
	}
	c.validatePresets(bad)
	validateModelsInterval(c, bad)
	checkZMQ := func(field, a string) {
		if a != "" && !strings.HasPrefix(a, "tcp://") && !strings.HasPrefix(a, "ipc://") {
			bad(field, "%q must be tcp:// or ipc://", a)
		}
	}
	checkTopic := func(field, tmpl string) {
		if tmpl != "" {
			if err := kvtopic.Validate(tmpl); err != nil {
				bad(field, "%v", err)
			}
		}
	}
	checkZMQ("kv_events_bind", c.KVEventsBind)
	checkTopic("kv_events_topic", c.KVEventsTopic)
	boundTopics := map[string]string{} // bind address + topic -> endpoint
	depNames := map[string]bool{}
	models := map[string]string{}
	epNames := map[string]string{}
	for i := range c.Deployments {
		d := &c.Deployments[i]
		f := fmt.Sprintf("deployments[%d]", i)
		if !NameRe.MatchString(d.Name) {
			bad(f+".name", "%s", nameProblem(d.Name))
		} else if depNames[d.Name] {
			bad(f+".name", "%q is used twice", d.Name)
		}
		depNames[d.Name] = true
		if len(d.Models) == 0 {
			d.Models = []string{d.Name}
		}
		for j, m := range d.Models {
			if m == "" || len(m) > 256 {
				bad(fmt.Sprintf("%s.models[%d]", f, j), "empty or longer than 256")
			} else if other, ok := models[m]; ok {
				bad(fmt.Sprintf("%s.models[%d]", f, j), "model %q already served by deployment %q", m, other)
			}
			models[m] = d.Name
		}
		if d.NginxMode != NginxModeHeader && d.NginxMode != NginxModeBody {
			bad(f+".nginx_mode", "%q must be header or body", d.NginxMode)
		}
		checkZMQ(f+".kv_events_bind", d.KVEventsBind)
		checkTopic(f+".kv_events_topic", d.KVEventsTopic)
		validateModels(f, d, bad)
		if d.PD.NoPrefill != "aggregate" && d.PD.NoPrefill != "reject" {
			bad(f+".pd.no_prefill", "%q must be aggregate or reject", d.PD.NoPrefill)
		}
		if len(d.Pools) == 0 {
			bad(f+".pools", "at least one pool is required")
		}
		if d.FlowControl != nil {
			d.FlowControl.validate(f+".flow_control", bad)
			if first := firstFlow(c); first != nil && first != d.FlowControl && !sameFlowHeaders(first, d.FlowControl) {
				// The proxies strip or pass these names for the whole listener.
				bad(f+".flow_control", "priority_header, tenant_header and trust must be the same in every deployment with flow_control")
			}
		}
		roles := map[string]bool{}
		for j := range d.Pools {
			p := &d.Pools[j]
			pf := fmt.Sprintf("%s.pools[%d]", f, j)
			switch p.Role {
			case RoleMixed, RolePrefill, RoleDecode:
			default:
				bad(pf+".role", "%q must be mixed, prefill or decode", p.Role)
			}
			if roles[p.Role] {
				bad(pf+".role", "role %q appears twice in deployment %q", p.Role, d.Name)
			}
			roles[p.Role] = true
			if m := p.MinReady; m != nil && (*m < 0 || *m > 10000) {
				bad(pf+".min_ready", "%d out of range [0, 10000] (unset: health.min_ready; 0: the pool may be empty)", *m)
			}
			if p.Discovery != nil {
				validateDiscovery(pf+".discovery", p, bad)
			}
			for k := range p.Endpoints {
				e := &p.Endpoints[k]
				ef := fmt.Sprintf("%s.endpoints[%d]", pf, k)
				if !NameRe.MatchString(e.Name) {
					bad(ef+".name", "%s", nameProblem(e.Name))
				} else if other, ok := epNames[e.Name]; ok {
					bad(ef+".name", "%q already used in %s (server names are global)", e.Name, other)
				}
				epNames[e.Name] = pf
				host, port, err := net.SplitHostPort(e.Address)
				if err != nil || host == "" || port == "" || strings.ContainsAny(e.Address, " \t\r\n\"'#;{}/") {
					bad(ef+".address", "%q must be host:port", e.Address)
				} else if pn, err := strconv.Atoi(port); err != nil || pn < 1 || pn > 65535 {
					bad(ef+".address", "port %q out of range", port)
				}
				checkZMQ(ef+".kv_events", e.KVEvents)
				if bind, tmpl := c.KVBinding(d, e); bind != "" {
					if p, err := kvtopic.Compile(tmpl, e.Name, e.Address); err != nil {
						bad(ef+".kv_topic", "%v", err)
					} else if other, dup := boundTopics[bind+" "+p.String()]; dup {
						bad(ef+".kv_topic", "topic %q on %s is also %s's: events could not be told apart", p, bind, other)
					} else {
						boundTopics[bind+" "+p.String()] = e.Name
					}
				}
				if e.Weight < 0 {
					bad(ef+".weight", "negative")
				}
			}
		}
		if roles[RolePrefill] != roles[RoleDecode] {
			bad(f+".pools", "prefill and decode pools come together")
		}
		if roles[RoleMixed] && roles[RolePrefill] {
			bad(f+".pools", "a deployment is either mixed or prefill/decode")
		}
	}
	if ce := AsError(errs); ce != nil {
		return ce
	}
	return nil
}

// ValidName reports whether s may be a server, pool or deployment name.
func ValidName(s string) bool { return NameRe.MatchString(s) }

// k8sNameRe is a DNS-1123 label (Service and namespace names).
var k8sNameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// k8sSubdomainRe is a DNS-1123 subdomain (object names such as an InferencePool's).
var k8sSubdomainRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$`)

// countSet counts the non-empty strings.
func countSet(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

// validateDiscovery checks what can be checked without a cluster; the label
// selector's syntax is checked by control/discovery/kube (it owns the parser)
// before the config is used.
func validateDiscovery(f string, p *PoolConfig, bad func(field, format string, a ...any)) {
	for _, e := range p.Endpoints {
		if !e.Discovered {
			bad(f, "a pool has endpoints or discovery, not both")
			break
		}
	}
	k := p.Discovery.Kubernetes
	if k == nil {
		bad(f, "no source: set discovery.kubernetes")
		return
	}
	kf := f + ".kubernetes"
	if n := countSet(k.Service, k.LabelSelector, k.InferencePool); n != 1 {
		bad(kf, "set exactly one of service, label_selector and inference_pool")
	}
	if k.InferencePool != "" {
		if !k8sSubdomainRe.MatchString(k.InferencePool) || len(k.InferencePool) > 253 {
			bad(kf+".inference_pool", "%q is not an InferencePool name", k.InferencePool)
		}
		if k.Port != "" {
			bad(kf+".port", "not used with inference_pool: the InferencePool's spec.targetPorts give the ports")
		}
	}
	if k.Service != "" && !k8sNameRe.MatchString(k.Service) {
		bad(kf+".service", "%q is not a Service name", k.Service)
	}
	if k.Namespace != "" && !k8sNameRe.MatchString(k.Namespace) {
		bad(kf+".namespace", "%q is not a namespace name", k.Namespace)
	}
	if k.Port != "" {
		if n, err := strconv.Atoi(k.Port); err == nil {
			if n < 1 || n > 65535 {
				bad(kf+".port", "port %d out of range", n)
			}
		} else if !k8sNameRe.MatchString(k.Port) {
			bad(kf+".port", "%q is neither a port number nor a port name", k.Port)
		}
	}
	if k.RoleLabel == "" && len(k.RoleValues) > 0 {
		bad(kf+".role_values", "needs role_label")
	}
	if k.ModelLabel == "" && len(k.ModelValues) > 0 {
		bad(kf+".model_values", "needs model_label")
	}
	switch k.AddressType {
	case "", "IPv4", "IPv6":
	default:
		bad(kf+".address_type", "%q must be IPv4 or IPv6", k.AddressType)
	}
	if k.VanishGrace != nil && k.VanishGrace.D() < 0 {
		bad(kf+".vanish_grace", "must not be negative (0s turns it off)")
	}
}

// HasDiscovery reports whether any pool finds its endpoints at run time.
func (c *Config) HasDiscovery() bool {
	for i := range c.Deployments {
		for j := range c.Deployments[i].Pools {
			if c.Deployments[i].Pools[j].Discovery != nil {
				return true
			}
		}
	}
	return false
}

// RouteCallTimeout bounds one proxy -> turnout call as the rendered glue
// sets it: proxy.route_timeout, but long enough for a prefill/decode
// decision, which runs the prefill (and one retry) inside the call.
func (c *Config) RouteCallTimeout() time.Duration {
	t := c.RouteAskTimeout()
	for i := range c.Deployments {
		if d := &c.Deployments[i]; d.IsPD() {
			// A held prefill/decode decision runs its prefill after the hold.
			t = max(t, 2*d.PD.PrefillTimeout.D()+time.Second+d.FlowControl.MaxHold())
		}
	}
	return t
}

// RouteAskTimeout bounds a route call that never runs a prefill (the
// first call of the split prefill/decode decision, nginx header mode):
// route_timeout, or longer when flow control may hold the answer, since
// a held decision answers within its class's max_wait. A dead turnout is
// noticed by the proxies' agent checks, not by this timeout.
func (c *Config) RouteAskTimeout() time.Duration {
	t := c.Proxy.RouteTimeout.D()
	for i := range c.Deployments {
		if h := c.Deployments[i].FlowControl.MaxHold(); h > 0 {
			t = max(t, c.Proxy.RouteTimeout.D()+h+time.Second)
		}
	}
	return t
}

// IsPD reports whether the deployment disaggregates prefill and decode.
func (d *DeploymentConfig) IsPD() bool {
	for _, p := range d.Pools {
		if p.Role == RolePrefill {
			return true
		}
	}
	return false
}

// KVBinding returns the bound SUB address that feeds endpoint e of
// deployment d, and its topic template; bind is "" when e dials its own
// publisher (kv_events) or no bind address is configured.
func (c *Config) KVBinding(d *DeploymentConfig, e *EndpointConfig) (bind, topic string) {
	if e.KVEvents != "" {
		return "", ""
	}
	bind = cmp.Or(d.KVEventsBind, c.KVEventsBind)
	if bind == "" {
		return "", ""
	}
	return bind, cmp.Or(e.KVTopic, d.KVEventsTopic, c.KVEventsTopic, kvtopic.DefaultTemplate)
}

// PoolPolicy returns the policy config that applies to a pool.
func (d *DeploymentConfig) PoolPolicy(p *PoolConfig) *PolicyConfig {
	if p.Policy != nil {
		return p.Policy
	}
	return &d.Policy
}
