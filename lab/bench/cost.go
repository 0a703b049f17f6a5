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
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/contract"
)

// Pre-built header names and values: the trivial handler must not allocate.
var (
	hdrServerB    = []byte(contract.HdrServer)
	hdrBackendB   = []byte(contract.HdrBackend)
	hdrPoolB      = []byte(contract.HdrPool)
	hdrFallbacksB = []byte(contract.HdrFallbacks)
	hdrDecisionB  = []byte(contract.HdrDecision)
	trivServer    = []byte("r0")
	trivBackend   = []byte("127.0.0.1:18000")
	trivPool      = []byte("bench_mixed")
	trivFallback  = []byte("r1,r2")
	trivDecision  = []byte("0000000000000001")
)

// TrivialHandler answers every request like /internal/route does, with
// fixed verdict headers and no work: the floor a decision is compared to.
func TrivialHandler(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.SetBytesKV(hdrServerB, trivServer)
	h.SetBytesKV(hdrBackendB, trivBackend)
	h.SetBytesKV(hdrPoolB, trivPool)
	h.SetBytesKV(hdrFallbacksB, trivFallback)
	h.SetBytesKV(hdrDecisionB, trivDecision)
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// NewTrivialServer uses the route server's settings (route.NewHTTPServer)
// so only the handler differs.
func NewTrivialServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler: TrivialHandler, Name: "turnout", NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true,
		MaxRequestBodySize: 4*(256<<10) + 1<<20, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 5 * time.Minute,
	}
}

// CostOptions configure the cost benchmark.
type CostOptions struct {
	Turnout string // turnout binary (serve, render)
	Lab     string // turnout-lab binary (mock replicas, the trivial handler)
	HAProxy string // haproxy binary ("" skips the HAProxy rows; missing: a note)
	// Nginx is the nginx binary ("" skips the nginx rows; missing: a note).
	Nginx string
	// NginxModule is the njs module the body-mode row needs (default
	// nginx.DefaultModulePath; missing: that row is a note).
	NginxModule string
	Wrk         string // wrk binary ("" = the Go load generator)
	// Duration of one load run; every target gets Rounds runs, interleaved,
	// so a noisy neighbour hurts all targets alike.
	Duration time.Duration
	Rounds   int
	Conns    int
	// WrkThreads is wrk's -t (keep it low: wrk shares the cores).
	WrkThreads int
	Replicas   int
	// Policies are measured on /internal/route alone.
	Policies []string
	// ProxyPolicy is turnout's policy behind HAProxy and behind nginx in
	// body mode (njs sends turnout the body).
	ProxyPolicy string
	// NginxHeaderPolicy is turnout's policy behind nginx in header mode
	// (auth_request): turnout sees headers only, so a prefix policy would
	// have nothing to match; session-hash is what header mode is for.
	NginxHeaderPolicy string
	// SSEProbes is how many sequential streaming requests per stack measure
	// the first-chunk delay.
	SSEProbes int
	// LargeBody is the size of the large-body rows' chat bodies (0: none).
	LargeBody int
	// LatencyDuration is the length of the 1-connection runs that measure
	// the added latency at light load (0: none).
	LatencyDuration time.Duration
	// IdleConns is how many idle keep-alive connections the HAProxy memory
	// rows hold open (0: none).
	IdleConns int
	Dir       string
	Log       *zerolog.Logger
}

// CostRow is one target of the cost benchmark.
type CostRow struct {
	// Group is route, haproxy, nginx, haproxy-sse or nginx-sse; the first
	// row of a group is the baseline its other rows are compared with.
	Group    string
	Target   string
	LoadGen  string
	Conns    int
	Requests int
	Errors   int
	RPS      float64
	P50, P99 float64 // ms
	// Ratio is the median over rounds of RPS / the baseline's RPS in the
	// same round; Added* are latency differences to the baseline, in ms.
	Ratio              float64
	AddedP50, AddedP99 float64
	Baseline           bool
	// Probe marks the sequential first-chunk rows: latency only, no rps.
	Probe bool
	// ProxyRSS is the proxy's resident memory (master and workers, MiB):
	// the median over rounds of each run's peak, or with IdleConns idle
	// connections open for the idle rows. TurnoutRSS is turnout's.
	ProxyRSS, TurnoutRSS float64
	// RSSRatio is ProxyRSS against the group baseline's.
	RSSRatio float64
	// ProxyCPU and TurnoutCPU are CPU time (user + system, /proc/PID/stat)
	// per request in µs, the median over rounds: steadier than req/s on a
	// busy box, where the neighbours take wall time but not this CPU.
	ProxyCPU, TurnoutCPU float64
	// Idle marks the idle keep-alive memory rows; IdleBefore is the proxy's
	// RSS before the connections were opened.
	Idle                 bool
	IdleBefore           float64
	Note                 string
	roundRPS             []float64
	roundP50s, roundP99s []float64
	roundProxyRSS        []float64
	roundTurnoutRSS      []float64
	roundProxyCPU        []float64
	roundTurnoutCPU      []float64
}

// RunCost measures /internal/route against a trivial handler, then the
// proxies in front of the same mock replicas, all in one interleaved set of
// rounds: plain HAProxy against HAProxy + Lua + turnout, and plain nginx
// against nginx + turnout in header mode (auth_request) and in body mode
// (njs); then the SSE first-chunk delay through each of them.
func RunCost(ctx context.Context, o CostOptions) ([]CostRow, error) {
	if o.Log == nil {
		l := zerolog.Nop()
		o.Log = &l
	}
	if o.Rounds < 1 || o.Conns < 1 || o.Duration <= 0 {
		return nil, errors.New("cost: rounds, conns and duration must be positive")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cost dir: %w", err)
	}
	rows, err := costRoute(ctx, o)
	if err != nil {
		return nil, err
	}
	prows, err := costProxy(ctx, o)
	if err != nil {
		return nil, err
	}
	return append(rows, prows...), nil
}

func (o *CostOptions) loadGenName() string {
	if o.Wrk != "" {
		return "wrk -t" + strconv.Itoa(o.WrkThreads)
	}
	return "go"
}

// costTarget is a load target and the group whose baseline it is compared
// with, with its own load shape: bodies, connections, run length.
type costTarget struct {
	Group string
	LoadTarget
	Bodies   []CostBody
	Conns    int
	Duration time.Duration
	// ProxyPIDs and TurnoutPIDs are sampled for memory during each run.
	ProxyPIDs, TurnoutPIDs []int
}

// runRounds loads each target Rounds times, interleaved (every round runs
// every target once, in order), and fills rows.
func runRounds(ctx context.Context, o CostOptions, targets []costTarget) ([]CostRow, error) {
	rows := make([]CostRow, len(targets))
	lats := make([][]time.Duration, len(targets))
	scripts := make([]string, len(targets))
	for i, t := range targets {
		rows[i] = CostRow{Group: t.Group, Target: t.Name, LoadGen: o.loadGenName(), Conns: t.Conns}
		if o.Wrk != "" {
			p, err := writeWrkScript(o.Dir, t.Group, t.LoadTarget, t.Bodies)
			if err != nil {
				return nil, err
			}
			scripts[i] = p
		}
	}
	var elapsed = make([]time.Duration, len(targets))
	for r := range o.Rounds {
		for i, t := range targets {
			var (
				res *LoadResult
				err error
			)
			prss, trss := sampleRSS(t.ProxyPIDs, 100*time.Millisecond), sampleRSS(t.TurnoutPIDs, 100*time.Millisecond)
			pcpu, tcpu := cpuOf(t.ProxyPIDs), cpuOf(t.TurnoutPIDs)
			if o.Wrk != "" {
				res, err = WrkLoad(ctx, o.Wrk, scripts[i], t.LoadTarget, o.WrkThreads, t.Conns, t.Duration)
			} else {
				res, err = GoLoad(ctx, t.LoadTarget, t.Bodies, t.Conns, t.Duration)
			}
			pm, tm := prss.Stop(), trss.Stop()
			pcpu, tcpu = cpuOf(t.ProxyPIDs)-pcpu, cpuOf(t.TurnoutPIDs)-tcpu
			if err != nil {
				return nil, err
			}
			if res.FirstErr != nil {
				o.Log.Warn().Err(res.FirstErr).Str("target", t.Name).Int("errors", res.Errors).Msg("bench cost: request errors")
			}
			row := &rows[i]
			row.Requests += res.Requests
			row.Errors += res.Errors
			elapsed[i] += res.Elapsed
			lats[i] = append(lats[i], res.Latencies...)
			row.roundRPS = append(row.roundRPS, res.RPS())
			row.roundP50s = append(row.roundP50s, float64(res.P50)/float64(time.Millisecond))
			row.roundP99s = append(row.roundP99s, float64(res.P99)/float64(time.Millisecond))
			row.roundProxyRSS = append(row.roundProxyRSS, pm)
			row.roundTurnoutRSS = append(row.roundTurnoutRSS, tm)
			if res.Requests > 0 {
				row.roundProxyCPU = append(row.roundProxyCPU, perRequestUs(pcpu, res.Requests))
				row.roundTurnoutCPU = append(row.roundTurnoutCPU, perRequestUs(tcpu, res.Requests))
			}
			o.Log.Info().Str("group", t.Group).Str("target", t.Name).Int("round", r+1).Float64("rps", res.RPS()).
				Dur("p50", res.P50).Dur("p99", res.P99).Int("errors", res.Errors).Float64("proxy_rss_mib", pm).Msg("bench cost: run")
		}
	}
	for i := range rows {
		row := &rows[i]
		if elapsed[i] > 0 {
			row.RPS = float64(row.Requests) / elapsed[i].Seconds()
		}
		if len(lats[i]) > 0 {
			s := Summarize(Millis(lats[i]))
			row.P50, row.P99 = s.P50, s.P99
		} else {
			// wrk gives percentiles per run only: take the median run's.
			row.P50, row.P99 = median(row.roundP50s), median(row.roundP99s)
		}
		row.ProxyRSS, row.TurnoutRSS = median(row.roundProxyRSS), median(row.roundTurnoutRSS)
		row.ProxyCPU, row.TurnoutCPU = median(row.roundProxyCPU), median(row.roundTurnoutCPU)
	}
	applyGroupBaselines(rows)
	return rows, nil
}

// cpuOf is the CPU time the processes used so far (0 for one that is gone).
func cpuOf(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		if c, err := procCPU(p); err == nil {
			sum += c
		}
	}
	return sum
}

func perRequestUs(cpu time.Duration, requests int) float64 {
	return float64(cpu) / float64(time.Microsecond) / float64(requests)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return Percentile(s, 50)
}

// applyGroupBaselines compares every row with the first row of its group
// (marked Baseline), wherever the group's rows sit: Added* are the latency
// differences in ms, and Ratio is the median of the per-round rps ratios
// when both rows have rounds (else the ratio of the totals). Rounds run the
// targets back to back, so a round's ratio compares like with like; the
// median of those resists a noisy neighbour better than the ratio of totals.
func applyGroupBaselines(rows []CostRow) {
	base := map[string]int{}
	for i := range rows {
		b, ok := base[rows[i].Group]
		if !ok {
			b = i
			base[rows[i].Group] = i
		}
		r, br := &rows[i], &rows[b]
		r.Baseline = i == b
		r.AddedP50 = r.P50 - br.P50
		r.AddedP99 = r.P99 - br.P99
		r.RSSRatio = Ratio(r.ProxyRSS, br.ProxyRSS)
		n := min(len(r.roundRPS), len(br.roundRPS))
		if n == 0 {
			r.Ratio = Ratio(r.RPS, br.RPS)
			continue
		}
		rs := make([]float64, n)
		for k := range n {
			rs[k] = Ratio(r.roundRPS[k], br.roundRPS[k])
		}
		r.Ratio = median(rs)
	}
}

// costRoute compares /internal/route (one turnout per policy) with the
// trivial handler. No completion feedback is sent: turnout's bounded
// decision ring overwrites (and counts) the oldest open decisions instead.
func costRoute(ctx context.Context, o CostOptions) ([]CostRow, error) {
	var ps procSet
	defer ps.stopAll()
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	tp, err := ps.start(o.Dir, "trivial", o.Lab, "bench", "trivial", "--listen", addr)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, tp, "http://"+addr+"/healthz", http.StatusOK, startupWait); err != nil {
		return nil, err
	}
	bodies := CostBodies(64, "llama", 1, false, 1)
	rt := func(name, addr string) costTarget {
		return costTarget{Group: "route", LoadTarget: LoadTarget{Name: name, Addr: addr, Path: contract.PathRoute, RouteHeaders: true},
			Bodies: bodies, Conns: o.Conns, Duration: o.Duration}
	}
	targets := []costTarget{rt("trivial-fasthttp", addr)}
	eps := make([]Endpoint, max(o.Replicas, 1))
	for i := range eps {
		eps[i] = Endpoint{Name: "r" + strconv.Itoa(i), Address: "127.0.0.1:" + strconv.Itoa(18000+i)}
	}
	for _, pol := range o.Policies {
		spec, err := ParsePolicySpec(pol)
		if err != nil {
			return nil, err
		}
		listen, syslog, err := turnoutAddrs()
		if err != nil {
			return nil, err
		}
		cfgPath := filepath.Join(o.Dir, "route-"+spec.Policy+".yaml")
		cfg := TurnoutConfig(ConfigOptions{Listen: listen, Model: "llama", Policy: spec, Endpoints: eps, DisableHealth: true,
			Syslog: syslog})
		if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
			return nil, fmt.Errorf("cost config: %w", err)
		}
		p, err := ps.start(o.Dir, "turnout-"+spec.Policy, o.Turnout, "serve", "--config", cfgPath, "--watch", "0", "--log-level", "warn")
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, p, "http://"+listen+contract.PathReadyz, http.StatusOK, startupWait); err != nil {
			return nil, err
		}
		targets = append(targets, rt("route "+spec.String(), listen))
	}
	return runRounds(ctx, o, targets)
}

// CostMockArgs make replicas answer at once (no model time) while streams
// still come as separate 1 ms-spaced chunks, so the proxies are the cost.
func CostMockArgs() []string {
	return []string{"--ttft-overhead", "0s", "--per-token-prefill", "0s", "--itl", "1ms", "--time-scale", "1",
		"--max-running", "0", "--cache-blocks", "4096", "--request-log-size", "-1"}
}

// proxyStack is one proxy setup of the cost run.
type proxyStack struct {
	group, name, dir string
	opts             StackOptions
}

// proxyStacks lists the proxy setups to measure, in round order, and note
// rows for the ones that cannot run here. Within a group the plain proxy
// comes first: it is the baseline.
func proxyStacks(o CostOptions) (stacks []proxyStack, notes []CostRow, err error) {
	spec, err := ParsePolicySpec(o.ProxyPolicy)
	if err != nil {
		return nil, nil, err
	}
	if spec.IsProxyAlone() {
		return nil, nil, fmt.Errorf("cost: proxy policy %s is not a turnout policy", spec)
	}
	base := StackOptions{Model: "llama", ProxySetup: ProxySetup{HAProxy: o.HAProxy, Nginx: o.Nginx, NginxModule: o.NginxModule, Turnout: o.Turnout, Lab: o.Lab}, Log: o.Log}
	add := func(group, name, dir string, spec PolicySpec, proxy string, edit func(*StackOptions)) {
		so := base
		so.Spec, so.Proxy = spec, proxy
		if edit != nil {
			edit(&so)
		}
		stacks = append(stacks, proxyStack{group: group, name: name, dir: dir, opts: so})
	}
	note := func(group, target, msg string) {
		o.Log.Warn().Str("group", group).Str("target", target).Msg("bench cost: " + msg)
		notes = append(notes, CostRow{Group: group, Target: target, Note: msg})
	}
	if o.HAProxy != "" {
		if _, lerr := exec.LookPath(o.HAProxy); lerr != nil {
			note("haproxy", "-", "skipped: haproxy not found")
		} else {
			// The baseline is HAProxy as an operator runs it without turnout:
			// default tune.bufsize, its own keep-alive defaults.
			add("haproxy", "haproxy roundrobin", "plain", PolicySpec{Policy: HAProxyRoundRobin}, ProxyHAProxy, nil)
			whole := haproxy.WholeBodyBufSize(stackMaxBody)
			add("haproxy", fmt.Sprintf("haproxy roundrobin, tune.bufsize %d (whole-body buffers, as PD renders)", whole), "plain-wholebody",
				PolicySpec{Policy: HAProxyRoundRobin}, ProxyHAProxy, func(so *StackOptions) { so.PlainBufSize = whole })
			add("haproxy", "haproxy+spoe+turnout "+spec.String()+" (default render)", "with-turnout-spoe", spec, ProxyHAProxy, nil)
			// What the default render's retry before bytes (retry-on, a
			// copy of each request) costs: the same without it.
			add("haproxy", "haproxy+spoe+turnout "+spec.String()+", l7_retries: false", "with-turnout-spoe-noretry", spec, ProxyHAProxy,
				func(so *StackOptions) { so.NoL7Retries = true })
			// What the first-token timer (response headers held for the
			// first body bytes) costs: the same without it.
			add("haproxy", "haproxy+spoe+turnout "+spec.String()+", first_token_timing: false", "with-turnout-spoe-notft", spec, ProxyHAProxy,
				func(so *StackOptions) { so.NoFirstTokenTiming = true })
			add("haproxy", "haproxy+lua+turnout "+spec.String(), "with-turnout-lua", spec, ProxyHAProxy,
				func(so *StackOptions) { so.HAProxyPath = config.HAProxyPathLua })
		}
	}
	if o.Nginx == "" {
		return stacks, notes, nil
	}
	if msg := NginxMissing(o.Nginx, o.NginxModule, false); msg != "" {
		note("nginx", "-", "skipped: "+msg)
		return stacks, notes, nil
	}
	hspec, err := ParsePolicySpec(o.NginxHeaderPolicy)
	if err != nil {
		return nil, nil, err
	}
	if hspec.IsProxyAlone() {
		return nil, nil, fmt.Errorf("cost: nginx header policy %s is not a turnout policy", hspec)
	}
	// nginx's defaults plus streaming settings; then the same with
	// turnout's in-memory body buffer.
	add("nginx", "nginx roundrobin", "nginx-plain", PolicySpec{Policy: NginxRoundRobin}, ProxyNginx, nil)
	add("nginx", fmt.Sprintf("nginx roundrobin, client_body_buffer_size %d (as body mode renders)", stackMaxBody), "nginx-plain-bodybuf",
		PolicySpec{Policy: NginxRoundRobin}, ProxyNginx, func(so *StackOptions) { so.PlainNginxBodyBuffer = true })
	// The first-token timer (an njs body filter, and njs itself in header
	// mode) costs the difference to the first_token_timing: false rows.
	njsMissing := NginxMissing(o.Nginx, o.NginxModule, true)
	headerName := "nginx+auth_request+turnout " + hspec.String()
	if njsMissing != "" {
		note("nginx", headerName, "skipped: "+njsMissing+" (the first-token timer)")
	} else {
		add("nginx", headerName, "nginx-header", hspec, ProxyNginx, func(so *StackOptions) { so.NginxMode = config.NginxModeHeader })
	}
	add("nginx", headerName+", first_token_timing: false", "nginx-header-notft", hspec, ProxyNginx,
		func(so *StackOptions) { so.NginxMode, so.NoFirstTokenTiming = config.NginxModeHeader, true })
	bodyName := "nginx+njs+turnout " + spec.String()
	if njsMissing != "" {
		note("nginx", bodyName, "skipped: "+njsMissing)
	} else {
		add("nginx", bodyName, "nginx-body", spec, ProxyNginx, func(so *StackOptions) { so.NginxMode = config.NginxModeBody })
		add("nginx", bodyName+", first_token_timing: false", "nginx-body-notft", spec, ProxyNginx,
			func(so *StackOptions) { so.NginxMode, so.NoFirstTokenTiming = config.NginxModeBody, true })
	}
	return stacks, notes, nil
}

// costProxy compares each proxy alone with the same proxy + turnout, all in
// front of the same replicas and measured in the same interleaved rounds,
// so a noisy neighbour hurts every row alike.
func costProxy(ctx context.Context, o CostOptions) ([]CostRow, error) {
	stacks, notes, err := proxyStacks(o)
	if err != nil || len(stacks) == 0 {
		return notes, err
	}
	var mocks procSet
	defer mocks.stopAll()
	var eps []Endpoint
	for i, name := range ReplicaNames(max(o.Replicas, 1)) {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		args := append([]string{"mock", "--listen", addr, "--name", name, "--model", "llama"}, CostMockArgs()...)
		p, err := mocks.start(o.Dir, "mock-"+strconv.Itoa(i), o.Lab, args...)
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, p, "http://"+addr+"/health", http.StatusOK, startupWait); err != nil {
			return nil, err
		}
		eps = append(eps, Endpoint{Name: name, Address: addr})
	}
	small := CostBodies(64, "llama", 1, false, 2)
	var large []CostBody
	if o.LargeBody > 0 {
		large = CostBodiesSized(16, "llama", 1, false, 4, o.LargeBody)
	}
	var targets, sseTargets, idleTargets []costTarget
	for _, ps := range stacks {
		so := ps.opts
		so.Dir, so.Mocks = filepath.Join(o.Dir, ps.dir), eps
		if err := os.MkdirAll(so.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("cost dir: %w", err)
		}
		st, err := StartStack(ctx, so)
		if err != nil {
			return nil, fmt.Errorf("cost %s: %w", ps.name, err)
		}
		defer st.Stop()
		t := costTarget{Group: ps.group, LoadTarget: LoadTarget{Name: ps.name, Addr: strings.TrimPrefix(st.FrontURL, "http://"), Path: mock.PathChat},
			Bodies: small, Conns: o.Conns, Duration: o.Duration, ProxyPIDs: procTree(st.ProxyPID)}
		if st.TurnoutPID > 0 {
			t.TurnoutPIDs = []int{st.TurnoutPID}
		}
		targets = append(targets, t)
		if large != nil {
			lt := t
			lt.Group, lt.Bodies = fmt.Sprintf("%s-%dk", ps.group, o.LargeBody>>10), large
			targets = append(targets, lt)
		}
		if o.LatencyDuration > 0 {
			ct := t
			ct.Group, ct.Conns, ct.Duration = ps.group+"-c1", 1, o.LatencyDuration
			targets = append(targets, ct)
		}
		st1 := t
		st1.Group = ps.group + "-sse"
		sseTargets = append(sseTargets, st1)
		if ps.group == "haproxy" && o.IdleConns > 0 && st1.ProxyPIDs != nil {
			it := t
			it.Group = "haproxy-idle"
			idleTargets = append(idleTargets, it)
		}
	}
	// One interleaved set of rounds for every load shape, so a noisy
	// neighbour hits all of them alike; rows are regrouped for the tables.
	rows, err := runRounds(ctx, o, targets)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(rows, func(a, b CostRow) int { return strings.Compare(groupOrder(a.Group), groupOrder(b.Group)) })
	sse, err := sseProbe(ctx, o, sseTargets, CostBodies(16, "llama", 8, true, 3))
	if err != nil {
		return nil, err
	}
	idle, err := idleRows(ctx, o, idleTargets)
	if err != nil {
		return nil, err
	}
	return slices.Concat(rows, sse, idle, notes), nil
}

// groupOrder sorts the load groups: per proxy, the main rows, the large
// bodies, then one connection.
func groupOrder(g string) string {
	proxy, shape, _ := strings.Cut(g, "-")
	switch {
	case shape == "":
		shape = "0"
	case shape == "c1":
		shape = "2"
	default:
		shape = "1" + shape
	}
	return proxy + "/" + shape
}

// idleRows measures each HAProxy setup's memory with IdleConns idle
// keep-alive connections open, one setup at a time.
func idleRows(ctx context.Context, o CostOptions, targets []costTarget) ([]CostRow, error) {
	rows := make([]CostRow, 0, len(targets))
	for _, t := range targets {
		res, err := idleKeepAlive(ctx, t.Addr, t.Path, t.ProxyPIDs, t.Bodies, o.IdleConns)
		if err != nil {
			return nil, fmt.Errorf("idle %s: %w", t.Name, err)
		}
		o.Log.Info().Str("target", t.Name).Int("conns", res.Conns).Int("errors", res.Errors).
			Float64("before_mib", res.Before).Float64("with_mib", res.With).Msg("bench cost: idle keep-alive")
		rows = append(rows, CostRow{Group: t.Group, Target: t.Name, LoadGen: "idle keep-alive", Conns: res.Conns,
			Requests: res.Conns - res.Errors, Errors: res.Errors, Idle: true, IdleBefore: res.Before, ProxyRSS: res.With})
	}
	applyGroupBaselines(rows)
	return rows, nil
}

// sseProbe sends streaming requests one at a time, alternating the
// targets, and measures the time to the first body chunk: what a chat user
// waits for, and what http-no-delay and the routing hop affect.
func sseProbe(ctx context.Context, o CostOptions, targets []costTarget, bodies []CostBody) ([]CostRow, error) {
	clients := make([]*http.Client, len(targets))
	firsts := make([][]time.Duration, len(targets))
	for i := range clients {
		tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		defer tr.CloseIdleConnections()
		clients[i] = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	errs := make([]int, len(targets))
	buf := make([]byte, 32<<10)
	for n := range o.SSEProbes {
		for i, t := range targets {
			b := bodies[n%len(bodies)]
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+t.Addr+t.Path, bytes.NewReader(b.Body))
			if err != nil {
				return nil, fmt.Errorf("sse probe: %w", err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", b.Session)
			t0 := time.Now()
			resp, err := clients[i].Do(req)
			if err != nil {
				errs[i]++
				continue
			}
			var first time.Duration
			for {
				k, rerr := resp.Body.Read(buf)
				if k > 0 && first == 0 {
					first = time.Since(t0)
				}
				if rerr != nil {
					break
				}
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK || first == 0 {
				errs[i]++
				continue
			}
			firsts[i] = append(firsts[i], first)
		}
	}
	rows := make([]CostRow, len(targets))
	for i, t := range targets {
		s := Summarize(Millis(firsts[i]))
		rows[i] = CostRow{Group: t.Group, Target: t.Name, LoadGen: "sequential", Conns: 1,
			Requests: len(firsts[i]), Errors: errs[i], P50: s.P50, P99: s.P99, Probe: true}
	}
	applyGroupBaselines(rows)
	for i := range rows {
		rows[i].Ratio = 0 // not a throughput run
	}
	return rows, nil
}

var costHeader = []string{"group", "target", "loadgen", "conns", "requests", "errors", "rps", "rps_ratio", "p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms",
	"proxy_rss_mib", "rss_ratio", "turnout_rss_mib", "idle_before_mib", "proxy_cpu_us_per_req", "turnout_cpu_us_per_req", "round_rps", "note"}

func (r *CostRow) fields() []string {
	var rounds []string
	for _, v := range r.roundRPS {
		rounds = append(rounds, strconv.FormatFloat(v, 'f', 0, 64))
	}
	f3 := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	return []string{r.Group, r.Target, r.LoadGen, strconv.Itoa(r.Conns), strconv.Itoa(r.Requests), strconv.Itoa(r.Errors),
		f1(r.RPS), f3(r.Ratio), f3(r.P50), f3(r.P99), f3(r.AddedP50), f3(r.AddedP99),
		f1(r.ProxyRSS), f3(r.RSSRatio), f1(r.TurnoutRSS), f1(r.IdleBefore), f1(r.ProxyCPU), f1(r.TurnoutCPU), strings.Join(rounds, " "), r.Note}
}

// WriteCostCSV writes cost rows with a header.
func WriteCostCSV(w io.Writer, rows []CostRow) error {
	return writeCSV(w, costHeader, len(rows), func(i int) []string { return rows[i].fields() })
}

// WriteCostTable writes cost rows for terminals.
func WriteCostTable(w io.Writer, rows []CostRow) error {
	return writeTable(w, "group\ttarget\tloadgen\tconns\trequests\terrors\trps\tratio\tp50 ms\tp99 ms\t+p50 ms\t+p99 ms\tproxy MiB\tRSS ratio\tturnout MiB\tproxy µs/req\tturnout µs/req\t", len(rows), func(tw io.Writer, i int) {
		r := &rows[i]
		if r.Note != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Group, r.Target, r.Note)
			return
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.3f\t%+.3f\t%+.3f\t%s\t%.2f\t%.1f\t%.1f\t%.1f\t\n", r.Group, r.Target, r.LoadGen, r.Conns,
			r.Requests, r.Errors, r.RPS, r.Ratio, r.P50, r.P99, r.AddedP50, r.AddedP99, r.rssText(), r.RSSRatio, r.TurnoutRSS, r.ProxyCPU, r.TurnoutCPU)
	})
}

// rssText is the proxy memory cell: the peak under load, or for the idle
// rows before -> with the idle connections.
func (r *CostRow) rssText() string {
	if r.Idle {
		return fmt.Sprintf("%.1f -> %.1f", r.IdleBefore, r.ProxyRSS)
	}
	if r.ProxyRSS == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", r.ProxyRSS)
}

// WriteCostMarkdown writes cost rows as a Markdown table.
func WriteCostMarkdown(w io.Writer, rows []CostRow) error {
	return writeMarkdown(w, "| group | target | load | rps | rps ratio | p50 ms | p99 ms | added p50 ms | added p99 ms | proxy RSS MiB | RSS ratio | turnout RSS MiB | proxy CPU µs/req | turnout CPU µs/req | errors |\n"+
		"|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", len(rows), func(b *strings.Builder, i int) {
		r := &rows[i]
		if r.Note != "" {
			fmt.Fprintf(b, "| %s | %s | %s ||||||||||||\n", r.Group, r.Target, r.Note)
			return
		}
		rps, ratio := fmt.Sprintf("%.0f", r.RPS), fmt.Sprintf("%.3f", r.Ratio)
		lat := fmt.Sprintf("%.3f | %.3f | %+.3f | %+.3f", r.P50, r.P99, r.AddedP50, r.AddedP99)
		if r.Probe || r.Idle {
			rps, ratio = "-", "-"
		}
		if r.Idle {
			lat = "- | - | - | -"
		}
		rssRatio, trss := "-", "-"
		if r.ProxyRSS > 0 {
			rssRatio = fmt.Sprintf("%.2f", r.RSSRatio)
		}
		if r.TurnoutRSS > 0 {
			trss = fmt.Sprintf("%.1f", r.TurnoutRSS)
		}
		pcpu, tcpu := "-", "-"
		if r.ProxyCPU > 0 {
			pcpu = fmt.Sprintf("%.1f", r.ProxyCPU)
		}
		if r.TurnoutCPU > 0 {
			tcpu = fmt.Sprintf("%.1f", r.TurnoutCPU)
		}
		fmt.Fprintf(b, "| %s | %s | %s c%d | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", r.Group, r.Target, r.LoadGen, r.Conns,
			rps, ratio, lat, r.rssText(), rssRatio, trss, pcpu, tcpu, r.Errors)
	})
}

// CostOutputs writes NAME.{txt,csv,md} into dir.
func CostOutputs(dir, name string, rows []CostRow) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	var errs []error
	for ext, fn := range map[string]func(io.Writer, []CostRow) error{".txt": WriteCostTable, ".csv": WriteCostCSV, ".md": WriteCostMarkdown} {
		errs = append(errs, writeFile(dir, name+ext, func(w io.Writer) error { return fn(w, rows) }))
	}
	return errors.Join(errs...)
}

// CheckCost fails when a throughput row did no work or errors dominate (smoke).
func CheckCost(rows []CostRow) error {
	var errs []error
	for _, r := range rows {
		if r.Note != "" {
			continue
		}
		if r.Requests == 0 || r.Errors > r.Requests/10 {
			errs = append(errs, fmt.Errorf("cost %s %s: %d requests, %d errors", r.Group, r.Target, r.Requests, r.Errors))
		}
	}
	return errors.Join(errs...)
}
