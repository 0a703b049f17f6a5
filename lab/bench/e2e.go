package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/policy"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/nginx"
	"github.com/turnout/turnout/route/contract"
)

// E2EOptions configure a replay through real processes on loopback:
// N `turnout-lab mock` replicas, `turnout serve`, and HAProxy or nginx (rendered
// by `turnout render haproxy|nginx`, or a plain config for the proxy-alone
// rows).
type E2EOptions struct {
	// Sim holds the replica model (cache, timing at full scale, max running)
	// and the replay shape (compress, concurrency, model).
	Sim SimOptions
	// TimeScale is the mocks' --time-scale; arrivals are scaled alike so the
	// load shape is the trace's, and measured times are divided by it.
	TimeScale float64
	// ProxySetup is every stack's; NginxMaxBody 0 is the replayed
	// requests' BodyLimit.
	ProxySetup
	// WorkDir holds one directory per run (configs and process logs).
	WorkDir string
	Keep    bool
	// Timeout bounds one policy's replay.
	Timeout time.Duration
	// Fronts, when set, replays every spec once per count through that
	// many fronts with cluster sync (fronts.go); NATSServer is the
	// nats-server binary they sync over ("" = nats-server on $PATH or in
	// /usr/sbin).
	Fronts     []int
	NATSServer string
	Log        *zerolog.Logger
}

// ErrMissingTool is returned when a proxy, njs or the turnout binary is absent.
var ErrMissingTool = errors.New("required tool not found")

// NeedsNginx reports whether any spec runs behind nginx, and whether one of
// them needs njs (a turnout policy: body mode, and in header mode the
// first-token timer the bench's configs keep on).
func (o *E2EOptions) NeedsNginx(specs []PolicySpec) (nginx, njs bool) {
	for _, s := range specs {
		if s.Proxy(o.Proxy) == ProxyNginx {
			nginx = true
			njs = njs || !s.IsProxyAlone()
		}
	}
	return nginx, njs
}

func (o *E2EOptions) validate(specs []PolicySpec) error {
	if err := o.Sim.Validate(); err != nil {
		return err
	}
	if o.TimeScale <= 0 || o.TimeScale > 1 {
		return fmt.Errorf("time scale %v out of range (0, 1]", o.TimeScale)
	}
	if o.Proxy != "" && o.Proxy != ProxyHAProxy && o.Proxy != ProxyNginx && o.Proxy != ProxyEPP {
		return fmt.Errorf("proxy %q: want haproxy, nginx or epp", o.Proxy)
	}
	if o.Proxy == ProxyEPP && len(o.Fronts) > 0 {
		return errors.New("fronts: several turnout fronts run behind HAProxy, not in the epp seat")
	}
	if o.NginxMode != "" && o.NginxMode != config.NginxModeBody && o.NginxMode != config.NginxModeHeader {
		return fmt.Errorf("nginx mode %q: want body or header", o.NginxMode)
	}
	bins := []string{o.Turnout, o.Lab}
	for _, s := range specs {
		if s.Proxy(o.Proxy) == ProxyHAProxy {
			bins = append(bins, o.HAProxy)
			break
		}
	}
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrMissingTool, bin, err)
		}
	}
	if ng, njs := o.NeedsNginx(specs); ng {
		if msg := NginxMissing(o.Nginx, o.NginxModule, njs); msg != "" {
			return fmt.Errorf("%w: %s", ErrMissingTool, msg)
		}
	}
	if len(o.Fronts) > 0 {
		bin, err := NATSBinary(o.NATSServer)
		if err != nil {
			return err
		}
		o.NATSServer = bin
	}
	if o.Log == nil {
		l := zerolog.Nop()
		o.Log = &l
	}
	return nil
}

// RunE2E replays reqs once per spec, each on a fresh stack (cold caches,
// fresh counters), and reads hit ratios and per-replica loads from the
// replicas' own /metrics.
func RunE2E(ctx context.Context, reqs []Request, trace string, specs []PolicySpec, o E2EOptions) ([]Row, error) {
	if err := o.validate(specs); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("e2e work dir: %w", err)
	}
	if o.Sim.LoRA.Adapters > 0 {
		reqs = WithAdapters(reqs, o.Sim.LoRA, o.Sim.Seed)
	}
	inf, pooled := CacheBounds(reqs, o.Sim.BlockSize, o.Sim.Replicas*o.Sim.CacheBlocks)
	if ng, _ := o.NeedsNginx(specs); ng && o.NginxMaxBody == 0 {
		o.NginxMaxBody = BodyLimit(reqs, o.Sim.Model)
		o.Log.Info().Int("max_body", o.NginxMaxBody).Msg("bench: nginx rows admit the largest body of the replay")
	}
	var (
		natsURL string
		err     error
	)
	if len(o.Fronts) > 0 {
		// One server for the whole run: core NATS keeps no state between
		// rows, and each row's fronts are new processes.
		var nats procSet
		defer nats.stopAll()
		if natsURL, err = startNATS(ctx, &nats, o.WorkDir, o.NATSServer); err != nil {
			return nil, err
		}
	}
	var rows []Row
	for _, spec := range specs {
		counts := o.Fronts
		if len(counts) == 0 {
			counts = []int{0} // one plain stack, no cluster
		}
		for _, n := range counts {
			var row Row
			if n == 0 {
				row, err = e2eRow(ctx, reqs, trace, spec, o, inf, pooled)
			} else {
				row, err = frontsRow(ctx, reqs, trace, spec, n, natsURL, o, inf, pooled)
			}
			if err != nil {
				return nil, fmt.Errorf("e2e %s: %w", spec, err)
			}
			o.Log.Info().Str("policy", row.Policy).Int("fronts", row.Fronts).Int("requests", row.Requests).Int("errors", row.Errors).
				Float64("hit", row.HitRatio).Float64("load", row.LoadReq).Float64("ttft_p50_ms", row.TTFT.P50).
				Float64("ttft_p90_ms", row.TTFT.P90).Dur("wall", row.Wall).Msg("bench: e2e row")
			rows = append(rows, row)
		}
	}
	return rows, nil
}

func e2eRow(ctx context.Context, reqs []Request, trace string, spec PolicySpec, o E2EOptions, inf, pooled float64) (Row, error) {
	start := time.Now()
	dir, err := os.MkdirTemp(o.WorkDir, "e2e-"+spec.Policy+"-")
	if err != nil {
		return Row{}, fmt.Errorf("run dir: %w", err)
	}
	if !o.Keep {
		defer os.RemoveAll(dir)
	}
	st, err := StartStack(ctx, StackOptions{
		Dir: dir, Spec: spec, ProxySetup: o.ProxySetup, Replicas: o.Sim.Replicas, Model: o.Sim.Model,
		MockArgs: ReplayMockArgs(o.Sim, o.TimeScale), Log: o.Log,
	})
	if err != nil {
		return Row{}, err
	}
	defer st.Stop()

	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	do := DriveOptions{
		URL: st.FrontURL, Model: o.Sim.Model, Concurrency: o.Sim.Concurrency,
		Compress: o.Sim.Compress, TimeScale: o.TimeScale, Log: o.Log,
	}
	if st.EPPAddr != "" {
		// TLS against the self-signed certificate, as the reference
		// gateway setups run it.
		cc, err := DialEPP(st.EPPAddr, true)
		if err != nil {
			return Row{}, err
		}
		defer cc.Close()
		up := replayTransport(o.Sim.Concurrency)
		defer up.CloseIdleConnections()
		do.Gateway = NewEnvoyGateway(cc, &http.Client{Transport: up})
	}
	res, err := Drive(rctx, reqs, do)
	if err != nil {
		return Row{}, err
	}
	if res.Replicas, err = st.ReplicaLoads(ctx); err != nil {
		return Row{}, err
	}
	row := MakeRow(e2eMode(spec, o), trace, spec, res, inf, pooled, 1/o.TimeScale)
	if o.Sim.LoRA.Adapters > 0 {
		row.Adapters = true
		for _, r := range res.Replicas {
			row.AdapterLoads += r.AdapterLoads
		}
	}
	if st.TurnoutURL != "" {
		text, err := getText(ctx, st.TurnoutURL+contract.PathMetrics)
		if err != nil {
			return Row{}, fmt.Errorf("turnout metrics: %w", err)
		}
		row.Detail = DecisionDetail(text)
	}
	if row.EngineTTFT > 0 {
		// The replicas' own mean TTFT (their histograms, model ms): on a
		// busy box it tells the engines' stalls from the routing's.
		row.Detail = strings.TrimSpace(fmt.Sprintf("%s engine_ttft_ms=%.0f", row.Detail, row.EngineTTFT))
	}
	row.Wall = time.Since(start)
	return row, nil
}

// ModeE2EEPP is the mode of a row replayed with turnout in the Endpoint
// Picker seat.
const ModeE2EEPP = "e2e-epp"

// e2eMode labels a row's mode column with the path it took: e2e (HAProxy),
// e2e-nginx (nginx alone or turnout in body mode), e2e-nginx-header,
// e2e-epp (turnout as the Endpoint Picker).
func e2eMode(spec PolicySpec, o E2EOptions) string {
	switch spec.Proxy(o.Proxy) {
	case ProxyEPP:
		return ModeE2EEPP
	case ProxyHAProxy:
		return "e2e"
	}
	if !spec.IsProxyAlone() && o.NginxMode == config.NginxModeHeader {
		return "e2e-nginx-header"
	}
	return "e2e-nginx"
}

// ReplayMockArgs are the `turnout-lab mock` flags that make a replica match the
// simulated one: same cache, same timing model, scaled.
func ReplayMockArgs(s SimOptions, timeScale float64) []string {
	args := []string{
		"--block-size", strconv.Itoa(s.BlockSize), "--cache-blocks", strconv.Itoa(s.CacheBlocks),
		"--max-running", strconv.Itoa(s.MaxRunning),
		"--ttft-overhead", s.Timing.TTFTOverhead.String(), "--per-token-prefill", s.Timing.PerTokenPrefill.String(),
		"--itl", s.Timing.InterTokenLatency.String(), "--time-scale", strconv.FormatFloat(timeScale, 'g', -1, 64),
		"--request-log-size", "-1",
	}
	if a := s.LoRA; a.Adapters > 0 {
		names := make([]string, a.Adapters)
		for k := range names {
			names[k] = AdapterName(k)
		}
		args = append(args, "--lora-modules", strings.Join(names, ","), "--max-loras", strconv.Itoa(a.MaxLoRAs),
			"--lora-load-cost", a.LoRALoadCost.String())
	}
	return args
}

// ProxySetup is the proxy a turnout policy sits behind and the binaries a
// stack runs: one stack's (StackOptions), or every stack's of a replay
// (E2EOptions).
type ProxySetup struct {
	// Proxy is what a turnout policy sits behind: haproxy (default), nginx
	// or epp (no proxy process: turnout's Endpoint Picker alone).
	// Proxy-alone specs name their own proxy.
	Proxy   string
	HAProxy string // haproxy binary
	Nginx   string // nginx binary
	// NginxMode is turnout's nginx_mode: body (default, njs) or header
	// (auth_request, no body for turnout).
	NginxMode string
	// NginxModule is the njs module path for `turnout render nginx` ("" =
	// its default).
	NginxModule string
	// NginxMaxBody is max_body (turnout's, and the plain nginx's body
	// limit) behind nginx; 0 = turnout's default.
	NginxMaxBody int
	Turnout      string // turnout binary (serve, render)
	Lab          string // turnout-lab binary (the mock replicas)
	// RequestLog: turnout logs every request (the chosen replica and why)
	// to requests.log in its stack's directory, to read with --keep.
	RequestLog bool
}

// StackOptions describe one proxy stack.
type StackOptions struct {
	Dir  string
	Spec PolicySpec // a turnout policy, or a proxy alone (haproxy-*, nginx-*)
	ProxySetup
	Replicas int
	Model    string
	// HAProxyPath is turnout's haproxy.path: "" (the rendered default,
	// SPOE on a unix socket), spoe or lua.
	HAProxyPath string
	// L7Retries renders turnout's HAProxy with retry before bytes
	// (haproxy.l7_retries: true): the cost row of that retry.
	L7Retries bool
	// HAProxyFeedback is turnout's haproxy.feedback ("" = the default,
	// udp): the cost row of the ring.
	HAProxyFeedback string
	// NoFirstTokenTiming renders turnout's proxy without the first-token
	// timer (proxy.first_token_timing: false): the cost row of that timer.
	NoFirstTokenTiming bool
	// Nbthread is HAProxy's nbthread, plain or rendered by turnout
	// (haproxy.nbthread; 0: HAProxy's default, one thread per CPU).
	Nbthread int
	// HAProxyEnv are VAR=VALUE entries added to HAProxy's environment
	// (e.g. glibc's malloc tunables, read only at process start).
	HAProxyEnv []string
	// RouteBody is turnout's route_body (0: the default), which sizes the
	// rendered HAProxy's tune.bufsize.
	RouteBody int
	// PlainBufSize is tune.bufsize of a plain HAProxy (0: HAProxy's
	// default, what an operator runs without turnout).
	PlainBufSize int
	// PlainNginxBodyBuffer gives a plain nginx turnout's in-memory body
	// buffer (client_body_buffer_size = max_body) instead of nginx's
	// default.
	PlainNginxBodyBuffer bool
	// MockArgs are extra `turnout-lab mock` flags (timing, cache).
	MockArgs []string
	// Mocks reuses running replicas instead of starting new ones.
	Mocks []Endpoint
	// DeploymentYAML are extra lines of turnout's deployment (flow_control).
	DeploymentYAML []string
	// ClusterNATS and ClusterName configure turnout's cluster sync (one of
	// several fronts, fronts.go; "" = off).
	ClusterNATS, ClusterName string
	Log                      *zerolog.Logger
}

// Stack is a running proxy in front of mock replicas.
type Stack struct {
	FrontURL   string // proxy frontend, http://host:port ("" in the epp seat)
	TurnoutURL string // "" for a proxy alone
	// EPPAddr is turnout's Endpoint Picker (self-signed TLS) in the epp
	// seat, "" elsewhere.
	EPPAddr string
	// ProxyPID is the HAProxy or nginx master; TurnoutPID is 0 for a proxy
	// alone. The cost bench reads their memory from /proc.
	ProxyPID, TurnoutPID int
	Mocks                []Endpoint // replicas (Address is host:port)
	procs                procSet
}

// stackMaxBody is turnout's default max_body: nginx body mode holds bodies
// up to it in memory, and a prefill/decode deployment sizes HAProxy's
// buffers by it. The equal-buffer baseline rows use the same.
const stackMaxBody = 256 << 10

// StartStack starts the replicas (unless given), turnout when the spec is a
// turnout policy, and the proxy, and waits until a request can pass.
func StartStack(ctx context.Context, o StackOptions) (_ *Stack, err error) {
	// A local, not the named result: "return nil, err" would nil it before
	// the deferred Stop ran (a panic that left every started process behind).
	st := &Stack{}
	defer func() {
		if err != nil {
			st.Stop()
		}
	}()
	kvAware := o.Spec.Policy == policy.KVAwareType
	st.Mocks = o.Mocks
	if len(st.Mocks) == 0 {
		if st.Mocks, err = startMocks(ctx, &st.procs, o.Dir, o.Lab, o.Model, o.Replicas, kvAware, o.MockArgs); err != nil {
			return nil, err
		}
	}
	switch o.Spec.Proxy(o.Proxy) {
	case ProxyEPP:
		err = st.startEPP(ctx, o)
	case ProxyNginx:
		err = st.startNginxStack(ctx, o)
	default:
		err = st.startHAProxyStack(ctx, o)
	}
	if err != nil {
		return nil, err
	}
	if kvAware {
		// ZMQ subscriptions connect asynchronously; events sent before that
		// are lost (and kv-aware falls back until the blocks reappear).
		time.Sleep(time.Second)
	}
	return st, nil
}

// startMocks starts n `turnout-lab mock` replicas serving model in ps,
// each with args (and with kvEvents its own KV events address), and waits
// until each answers /health.
func startMocks(ctx context.Context, ps *procSet, dir, lab, model string, n int, kvEvents bool, args []string) ([]Endpoint, error) {
	var eps []Endpoint
	for i, name := range ReplicaNames(n) {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		ep := Endpoint{Name: name, Address: addr}
		margs := append([]string{"mock", "--listen", addr, "--name", name, "--model", model}, args...)
		if kvEvents {
			kvAddr, err := freeAddr()
			if err != nil {
				return nil, err
			}
			ep.KVEvents = "tcp://" + kvAddr
			margs = append(margs, "--kv-events", ep.KVEvents)
		}
		p, err := ps.start(dir, "mock-"+strconv.Itoa(i), lab, margs...)
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, p, "http://"+addr+"/health", http.StatusOK, startupWait); err != nil {
			return nil, err
		}
		eps = append(eps, ep)
	}
	return eps, nil
}

// frontAddr picks the proxy's frontend address and sets FrontURL.
func (st *Stack) frontAddr() (string, error) {
	front, err := freeAddr()
	if err != nil {
		return "", err
	}
	st.FrontURL = "http://" + front
	return front, nil
}

// startEPP starts turnout alone with its Endpoint Picker on: the gateway
// is the driver's.
func (st *Stack) startEPP(ctx context.Context, o StackOptions) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	if err := st.startTurnout(ctx, o, ConfigOptions{EPPListen: addr, EPPTLS: config.EPPTLSSelfSigned}, ""); err != nil {
		return err
	}
	st.EPPAddr = addr
	return nil
}

// proxyDir is the front address a proxy listens on and its directory
// (made) under o.Dir.
func (st *Stack) proxyDir(o StackOptions, name string) (front, dir string, err error) {
	if front, err = st.frontAddr(); err != nil {
		return "", "", err
	}
	dir = filepath.Join(o.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("%s dir: %w", name, err)
	}
	return front, dir, nil
}

// startHAProxyStack starts HAProxy alone or turnout + rendered HAProxy.
func (st *Stack) startHAProxyStack(ctx context.Context, o StackOptions) error {
	front, hapDir, err := st.proxyDir(o, "haproxy")
	if err != nil {
		return err
	}
	if o.Spec.IsHAProxy() {
		cfg := PlainHAProxyConfig(PlainHAProxyOptions{
			Dir: hapDir, Listen: front, Balance: strings.TrimPrefix(o.Spec.Policy, "haproxy-"), Servers: st.Mocks, BufSize: o.PlainBufSize,
			Nbthread: o.Nbthread,
		})
		if err := os.WriteFile(filepath.Join(hapDir, "haproxy.cfg"), cfg, 0o644); err != nil {
			return fmt.Errorf("haproxy config: %w", err)
		}
	} else {
		cfg := ConfigOptions{HAProxyListen: front, HAProxyDir: hapDir, HAProxyPath: o.HAProxyPath, L7Retries: o.L7Retries, HAProxyFeedback: o.HAProxyFeedback,
			HAProxyNbthread: o.Nbthread, RouteBody: o.RouteBody}
		if err := st.startTurnout(ctx, o, cfg, ProxyHAProxy, "--out", hapDir); err != nil {
			return err
		}
	}
	bin, args := o.HAProxy, []string{"-W", "-f", filepath.Join(hapDir, "haproxy.cfg")}
	if len(o.HAProxyEnv) > 0 {
		// env execs HAProxy: the PID stays the master's.
		bin, args = "env", slices.Concat(o.HAProxyEnv, []string{o.HAProxy}, args)
	}
	hp, err := st.procs.start(o.Dir, "haproxy", bin, args...)
	if err != nil {
		return err
	}
	st.ProxyPID = hp.cmd.Process.Pid
	// GET passes without a routing decision (only POSTs ask turnout), so
	// this proves HAProxy and a replica are up. HAProxy starts servers as
	// up, so no health-check round has to pass first.
	return waitHTTP(ctx, hp, st.FrontURL+"/v1/models", http.StatusOK, startupWait)
}

// startNginxStack starts nginx alone or turnout + rendered nginx (header or
// body mode).
func (st *Stack) startNginxStack(ctx context.Context, o StackOptions) error {
	front, ngDir, err := st.proxyDir(o, "nginx")
	if err != nil {
		return err
	}
	if o.Spec.IsNginx() {
		balance := ""
		if o.Spec.Policy == NginxLeastConn {
			balance = "least_conn"
		}
		po := PlainNginxOptions{Dir: ngDir, Listen: front, Balance: balance, Servers: st.Mocks, User: nginxUser(),
			// The replay's largest body must pass (nginx's default limit is 1 MiB).
			MaxBodyLimit: o.NginxMaxBody}
		if o.PlainNginxBodyBuffer {
			po.MaxBody = max(o.NginxMaxBody, stackMaxBody)
		}
		cfg := PlainNginxConfig(po)
		if err := os.WriteFile(filepath.Join(ngDir, nginx.ConfigFile), cfg, 0o644); err != nil {
			return fmt.Errorf("nginx config: %w", err)
		}
	} else {
		mode := o.NginxMode
		if mode == "" {
			mode = config.NginxModeBody
		}
		cfg := ConfigOptions{NginxListen: front, NginxDir: ngDir, NginxMode: mode, MaxBody: o.NginxMaxBody}
		if err := st.startTurnout(ctx, o, cfg, ProxyNginx, renderNginxArgs(ngDir, o.NginxModule)...); err != nil {
			return err
		}
	}
	return st.startNginx(ctx, o.Dir, ngDir, o.Nginx)
}

// startTurnout writes the config (base carries the proxy's section), renders
// the proxy's files with `turnout render TARGET --config FILE ARGS...`
// (target "": nothing to render) and starts serve.
func (st *Stack) startTurnout(ctx context.Context, o StackOptions, base ConfigOptions, target string, renderArgs ...string) error {
	listen, syslog, err := turnoutAddrs()
	if err != nil {
		return err
	}
	base.Listen, base.Model, base.Policy, base.Endpoints = listen, o.Model, o.Spec, st.Mocks
	base.DeploymentYAML = o.DeploymentYAML
	base.ClusterNATS, base.ClusterName = o.ClusterNATS, o.ClusterName
	base.Syslog = syslog
	if o.RequestLog {
		base.RequestLog = filepath.Join(o.Dir, "requests.log")
	}
	// turnout's own checks would only add load; the proxy checks the replicas.
	base.DisableHealth = true
	base.NoFirstTokenTiming = o.NoFirstTokenTiming
	cfgPath := filepath.Join(o.Dir, "turnout.yaml")
	if err := os.WriteFile(cfgPath, TurnoutConfig(base), 0o644); err != nil {
		return fmt.Errorf("turnout config: %w", err)
	}
	if target != "" {
		args := append([]string{"render", target, "--config", cfgPath}, renderArgs...)
		out, err := exec.CommandContext(ctx, o.Turnout, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("turnout render %s: %w\n%s", target, err, bytes.TrimSpace(out))
		}
	}
	tp, err := st.procs.start(o.Dir, "turnout", o.Turnout, "serve", "--config", cfgPath, "--watch", "0", "--log-level", "warn")
	if err != nil {
		return err
	}
	st.TurnoutPID = tp.cmd.Process.Pid
	st.TurnoutURL = "http://" + listen
	return waitHTTP(ctx, tp, st.TurnoutURL+contract.PathReadyz, http.StatusOK, startupWait)
}

// ReplicaLoads reads each replica's counters from its /metrics.
func (st *Stack) ReplicaLoads(ctx context.Context) ([]ReplicaLoad, error) {
	out := make([]ReplicaLoad, len(st.Mocks))
	for i, m := range st.Mocks {
		text, err := getText(ctx, "http://"+m.Address+"/metrics")
		if err != nil {
			return nil, fmt.Errorf("replica %s metrics: %w", m.Name, err)
		}
		s := ParseProm(text)
		out[i] = ReplicaLoad{
			Name:         m.Name,
			Requests:     int64(SumProm(s, "mock_requests_total")),
			PromptTokens: int64(SumProm(s, "vllm:prefix_cache_queries_total")),
			CachedTokens: int64(SumProm(s, "vllm:prefix_cache_hits_total")),
			OutputTokens: int64(SumProm(s, "vllm:generation_tokens_total")),
			TTFTSeconds:  SumProm(s, "vllm:time_to_first_token_seconds_sum"),
			TTFTCount:    int64(SumProm(s, "vllm:time_to_first_token_seconds_count")),
			AdapterLoads: int64(SumProm(s, "mock_lora_loads_total")),
		}
	}
	return out, nil
}

// Stop stops every process of the stack.
func (st *Stack) Stop() { st.procs.stopAll() }

// DriveOptions shape the e2e load: the trace's arrivals, compressed and
// scaled, with a bound on requests in flight.
type DriveOptions struct {
	URL string
	// URLs, when set, are several fronts: request r goes through
	// URLs[Front[r.Index]] (FrontOf), or without Front request i (its
	// position in the replay) through URLs[i mod len(URLs)]; URL is not
	// used.
	URLs  []string
	Front []int
	// Gateway, when set, carries every request instead of URL: the
	// driver is the Envoy-like gateway, turnout its Endpoint Picker.
	Gateway     *EnvoyGateway
	Model       string
	Concurrency int
	Compress    float64
	TimeScale   float64
	Log         *zerolog.Logger
}

// Drive sends every request at its (compressed, scaled) arrival time as a
// streaming chat completion and measures the first SSE chunk (TTFT) and the
// end of the stream from the scheduled time, so lateness under the
// concurrency bound counts. A 429 is a shed request (RunResult.Shed, -1 in
// ByIndex), not an error. Replica loads are left for the caller.
func Drive(ctx context.Context, reqs []Request, o DriveOptions) (*RunResult, error) {
	conc := o.Concurrency
	if conc <= 0 {
		conc = len(reqs)
	}
	tr := replayTransport(conc)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	sem := make(chan struct{}, conc)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		res      RunResult
		firstErr error
		last     time.Time
	)
	res.ByIndex = notServed(reqs)
	start := time.Now()
	factor := o.TimeScale / o.Compress
loop:
	for i := range reqs {
		r := &reqs[i]
		due := start.Add(time.Duration(float64(r.Arrival) * factor))
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				break loop
			case <-time.After(d):
			}
		}
		select {
		case <-ctx.Done():
			break loop
		case sem <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			url := o.URL
			switch {
			case len(o.URLs) > 0 && r.Index < len(o.Front):
				url = o.URLs[o.Front[r.Index]%len(o.URLs)]
			case len(o.URLs) > 0:
				url = o.URLs[i%len(o.URLs)]
			}
			var ttft, e2e time.Duration
			var err error
			if o.Gateway != nil {
				ttft, e2e, err = gatewayOne(ctx, o, r, due)
			} else {
				ttft, e2e, err = streamOne(ctx, client, url, o, r, due)
			}
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, ErrShed) {
				res.Shed++
				return
			}
			if err != nil {
				res.Errors++
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			res.TTFT = append(res.TTFT, ttft)
			res.E2E = append(res.E2E, e2e)
			res.ByIndex[r.Index] = ttft
			if now := due.Add(e2e); now.After(last) {
				last = now
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("replay: %w (%d of %d done)", err, len(res.TTFT), len(reqs))
	}
	res.Requests = len(res.TTFT)
	if !last.IsZero() {
		res.Span = last.Sub(start)
	}
	if firstErr != nil && o.Log != nil {
		o.Log.Warn().Err(firstErr).Int("errors", res.Errors).Msg("bench: replay errors")
	}
	if res.Requests == 0 {
		return nil, fmt.Errorf("replay: no request succeeded: %w", firstErr)
	}
	return &res, nil
}

// replayTransport is the replay's client side to a proxy or the replicas:
// keep-alive connections for conc requests in flight.
func replayTransport(conc int) *http.Transport {
	return &http.Transport{
		MaxIdleConns: conc + 8, MaxIdleConnsPerHost: conc + 8, IdleConnTimeout: 90 * time.Second,
		DisableCompression: true,
	}
}

var sseDone = []byte("data: [DONE]")

// replayRequest is the streamed chat completion request r (for its
// adapter, else model) and its headers.
func replayRequest(r *Request, model string) ([]byte, http.Header) {
	body := AppendChatBody(make([]byte, 0, r.InputTokens*(wordLen+1)+256), r, BodyOptions{Model: r.ModelOr(model), Stream: true})
	// The request id names the trace's request in turnout's request log.
	h := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"replay-" + strconv.Itoa(r.Index)}}
	if r.Session != "" {
		h.Set("X-Session-Id", r.Session)
	}
	if r.Class != "" {
		h.Set(FlowPriorityHeader, r.Class)
	}
	if r.Tenant != "" {
		h.Set(FlowTenantHeader, r.Tenant)
	}
	return body, h
}

// gatewayOne sends one request through the Envoy-like gateway: TTFT is
// when the first response bytes came back through ext_proc, as the
// gateway's client would see them.
func gatewayOne(ctx context.Context, o DriveOptions, r *Request, due time.Time) (ttft, e2e time.Duration, err error) {
	body, h := replayRequest(r, o.Model)
	res, err := o.Gateway.Do(ctx, GatewayRequest{Path: mock.PathChat, Header: h, Body: body, Mode: GatewayFullDuplex})
	if err != nil {
		return 0, 0, fmt.Errorf("request %d: %w", r.Index, err)
	}
	e2e = time.Since(due)
	switch {
	case res.Refused != 0:
		return 0, 0, fmt.Errorf("request %d: refused %d %s: %s", r.Index, res.Refused, res.Reason, bytes.TrimSpace(res.Body))
	case res.Status != http.StatusOK:
		return 0, 0, fmt.Errorf("request %d: status %d from %s: %s", r.Index, res.Status, res.Served, bytes.TrimSpace(res.Passed))
	case !bytes.Contains(res.Passed[max(0, len(res.Passed)-64):], sseDone):
		return 0, 0, fmt.Errorf("request %d: stream ended without [DONE]", r.Index)
	}
	return res.FirstPassed.Sub(due), e2e, nil
}

// streamOne sends one request and reads its stream to the end.
func streamOne(ctx context.Context, c *http.Client, url string, o DriveOptions, r *Request, due time.Time) (ttft, e2e time.Duration, err error) {
	body, h := replayRequest(r, o.Model)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, fmt.Errorf("request %d: %w", r.Index, err)
	}
	req.Header = h
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("request %d: %w", r.Index, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode == http.StatusTooManyRequests {
			return 0, 0, fmt.Errorf("request %d: %w: %s", r.Index, ErrShed, bytes.TrimSpace(b))
		}
		return 0, 0, fmt.Errorf("request %d: status %d: %s", r.Index, resp.StatusCode, bytes.TrimSpace(b))
	}
	buf := make([]byte, 16<<10)
	var tail []byte
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if ttft == 0 {
				ttft = time.Since(due)
			}
			tail = append(tail, buf[:n]...)
			if len(tail) > 64 {
				tail = tail[len(tail)-64:]
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return 0, 0, fmt.Errorf("request %d: stream: %w", r.Index, rerr)
		}
	}
	if !bytes.Contains(tail, sseDone) {
		return 0, 0, fmt.Errorf("request %d: stream ended without [DONE]", r.Index)
	}
	return ttft, time.Since(due), nil
}

// notServed is a ByIndex for reqs with every request not (yet) served.
func notServed(reqs []Request) []time.Duration {
	n := 0
	for i := range reqs {
		n = max(n, reqs[i].Index+1)
	}
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = -1
	}
	return out
}
