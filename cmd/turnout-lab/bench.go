package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"

	"github.com/turnout/turnout/lab/bench"
	"github.com/turnout/turnout/nginx"
)

const benchUsage = `turnout-lab bench: routing quality and cost benchmarks

  turnout-lab bench replay --trace FILE [--mode sim|e2e] [--policies SPECS] [--sweep none|quick|full] ...
  turnout-lab bench azure  [--trace FILE] ...        (replay of the Azure CSV: lengths only)
  turnout-lab bench flow   [--trace FILE] [--loads 1.2,1.5] ...  (flow control: TTFT per class, e2e)
  turnout-lab bench slo    [--trace FILE] [--compress C] [--seeds 1,2,3] ...  (TTFT objective attainment per class, sim)
  turnout-lab bench cost   [--duration D] ...        (/internal/route vs a trivial handler; HAProxy and nginx alone vs with turnout)
  turnout-lab bench transports [--duration D] ...    (decisions/s and CPU per decision: /internal/route, SPOE, Endpoint Picker)
  turnout-lab bench scale [--endpoints 16,64,256,1024] ... (the decision core in process: decisions/s per core by policy, pool and prompt size)
  turnout-lab bench scale --kv [--publishers 64,256,1024] ... (KV events ingested per core from N mock vLLM publishers)
  turnout-lab bench kvpub [--publishers N] [--rate N]  (mock vLLM KV-event publishers, for bench scale --kv)
  turnout-lab bench trivial --listen ADDR            (the trivial fasthttp handler cost compares against)
  turnout-lab bench policies                         (the default comparison rows, one per line)

Traces are read from ../shared/traces/ by default; a missing trace is skipped
with a message (use --trace synthetic for a small generated one).
The e2e replay and the cost rows run turnout serve and render from the
turnout binary next to this one (else $PATH; --turnout-bin overrides) and
the mock replicas from this binary.
Run "turnout-lab bench <command> --help" for the flags.

Example:
  turnout-lab bench replay --trace synthetic --limit 200
`

// Default trace locations, relative to the repository root (never copied in).
const (
	defaultMooncake = "../shared/traces/mooncake_synthetic_trace.jsonl"
	defaultAzure    = "../shared/traces/azure_llm_2023_conv.csv"
	syntheticTrace  = "synthetic"
)

// runBench dispatches the benchmark subcommands.
func runBench(args []string, log *zerolog.Logger) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, benchUsage)
		return errors.New("bench: a subcommand is required")
	}
	if cli.WantsHelp(args[:1]) {
		return &cli.HelpShown{Text: benchUsage}
	}
	cmds := []struct {
		name string
		run  func([]string, *zerolog.Logger) error
	}{
		{"replay", func(a []string, log *zerolog.Logger) error { return runReplay(a, defaultMooncake, log) }},
		{"azure", func(a []string, log *zerolog.Logger) error { return runReplay(a, defaultAzure, log) }},
		{"cost", runCost},
		{"flow", runFlow},
		{"slo", runSLO},
		{"transports", runTransports},
		{"scale", runScale},
		{"kvpub", runKVPub},
		{"trivial", runTrivial},
		{"policies", runPolicies},
	}
	names := make([]string, len(cmds))
	for i, c := range cmds {
		if c.name == args[0] {
			return c.run(args[1:], log)
		}
		names[i] = c.name
	}
	last := len(names) - 1
	return fmt.Errorf("%s (want %s or %s)", cli.UnknownCommand("bench", args[0], names), strings.Join(names[:last], ", "), names[last])
}

// runPolicies implements `turnout-lab bench policies`.
func runPolicies(args []string, _ *zerolog.Logger) error {
	if cli.WantsHelp(args) {
		return &cli.HelpShown{Text: "Usage: turnout-lab bench policies\n\nPrints the default comparison rows of bench replay, one per line.\n\nExample:\n  turnout-lab bench replay --policies \"$(turnout-lab bench policies | tr '\\n' ';')\"\n"}
	}
	for _, p := range bench.DefaultPolicies() {
		fmt.Println(p)
	}
	return nil
}

// simReplicaFlags binds the sim's replica and load flags (replay, slo) to o,
// with d's values as defaults.
func simReplicaFlags(fset *flag.FlagSet, o *bench.SimOptions, d bench.SimOptions) {
	fset.IntVar(&o.Replicas, "replicas", d.Replicas, "number of replicas")
	fset.IntVar(&o.BlockSize, "block-size", d.BlockSize, "replica KV block size in tokens")
	fset.IntVar(&o.CacheBlocks, "cache-blocks", d.CacheBlocks, "replica prefix cache capacity in blocks")
	fset.IntVar(&o.MaxRunning, "max-running", d.MaxRunning, "running sequences per replica (0 = unlimited)")
	fset.DurationVar(&o.Timing.TTFTOverhead, "ttft-overhead", d.Timing.TTFTOverhead, "replica TTFT overhead")
	fset.DurationVar(&o.Timing.PerTokenPrefill, "per-token-prefill", d.Timing.PerTokenPrefill, "replica prefill time per uncached token")
	fset.DurationVar(&o.Timing.InterTokenLatency, "itl", d.Timing.InterTokenLatency, "replica inter-token latency")
	fset.Float64Var(&o.Compress, "compress", d.Compress, "divide arrival times by this factor (more load)")
}

func runReplay(args []string, defaultTrace string, log *zerolog.Logger) error {
	d := bench.DefaultSimOptions()
	fset := cli.NewFlags("bench replay")
	trace := fset.String("trace", defaultTrace, `trace file (.jsonl Mooncake, .csv Azure) or "synthetic"`)
	mode := fset.String("mode", "sim", "sim (in-process, virtual time) or e2e (HAProxy, nginx or an Envoy-like gateway + turnout + mock replicas)")
	policies := fset.String("policies", "", `';'-separated specs "name[:k=v,...]" (default: haproxy-roundrobin, haproxy-leastconn, or with --proxy nginx nginx-roundrobin, nginx-leastconn, and every turnout policy)`)
	sweep := fset.String("sweep", "none", "parameter sweep after the policies: none, quick or full (sim only)")
	limit := fset.Int("limit", 0, "replay only the first N requests (0 = all)")
	sessionBlocks := fset.Int("session-blocks", 1, "session key = the first N hash ids (0 = no session header)")
	out := fset.String("out", "bench-out", "output directory")
	name := fset.String("name", "", "output file name prefix (default: replay-MODE-TRACE)")
	check := fset.Bool("check", false, "fail unless every row is sane (requests > 0, hit ratio in [0,1]); for the smoke run")
	o := d
	simReplicaFlags(fset, &o, d)
	fset.IntVar(&o.Concurrency, "concurrency", d.Concurrency, "client-side bound on requests in flight (0 = unlimited)")
	fset.Uint64Var(&o.Seed, "seed", d.Seed, "seed for turnout's policies")
	fset.IntVar(&o.Parallel, "parallel", runtime.GOMAXPROCS(0), "sim: policies replayed at once")
	fset.IntVar(&o.LoRA.Adapters, "adapters", 0, "every request names one of N LoRA adapters (Zipf popularity; 0 = the base model); e2e: the mocks serve them")
	fset.Float64Var(&o.LoRA.Zipf, "adapter-zipf", d.LoRA.Zipf, "adapter popularity exponent s > 1 (weight 1/(k+1)^s)")
	fset.IntVar(&o.LoRA.MaxLoRAs, "max-loras", d.LoRA.MaxLoRAs, "adapters each replica holds at once (an LRU; e2e: the mocks' --max-loras)")
	fset.DurationVar(&o.LoRA.LoRALoadCost, "lora-load-cost", d.LoRA.LoRALoadCost, "time to load an adapter that is not held, before the prefill (e2e: the mocks', scaled by --time-scale)")
	fset.BoolVar(&o.LoRA.PerRequest, "adapter-per-request", false, "draw every request's adapter on its own (default: one per prompt root, the first hash id or the session)")
	firstToken := fset.Bool("first-token", true, "sim: the feedback carries each request's first-token time (tft=, proxy.first_token_timing); false: only the headers' time")
	e2e := defaultE2EFlags(fset)
	fronts := fset.String("fronts", "", `replay each policy through N turnout fronts with cluster sync, before the same replicas, requests split by --split: one row per count, in order, e.g. "1,2,4", or "1,2,4,1,2,4" for interleaved rounds ("" = one plain stack, no cluster). e2e: N HAProxy + turnout stacks over one nats-server; sim: N in-process instances whose sync arrives --sync-delay later`)
	fset.StringVar(&o.Split, "split", bench.SplitRequest, "--fronts: request (request i through front i mod N) or turn (a conversation's k-th turn through front (k + c) mod N, c drawn per conversation from --seed: consecutive turns alternate fronts)")
	jitter := fset.Duration("jitter", 0, "delay each arrival by a draw in [0, D) from --seed (trace time, before --compress), so each seed replays another interleaving (e2e and sim alike; 0 = the trace's arrivals)")
	fset.DurationVar(&o.SyncDelay, "sync-delay", time.Millisecond, "sim --fronts: how long a front's decisions and completions take to reach the other fronts (virtual time)")
	fset.BoolVar(&o.SharedScrapes, "shared-scrapes", false, "sim --fronts: model engine_metrics.share (each replica's engine figures read by one front, reaching the others --sync-delay later)")
	fset.IntVar(&o.RouteBody, "route-body", 0, "sim: turnout routes on each body's first N bytes (X-Body-Truncated), as behind a proxy with route_body N (0 = whole bodies)")
	natsServer := fset.String("nats-server", "nats-server", "e2e --fronts: nats-server binary ($PATH, else /usr/sbin)")
	if err := cli.ParseFlags(fset, benchReplayCmd, args); err != nil {
		return err
	}
	o.Log = log
	o.NoFirstToken = !*firstToken
	var frontCounts []int
	if *fronts != "" {
		var err error
		if frontCounts, err = bench.ParseFronts(*fronts); err != nil {
			return fmt.Errorf("bench replay: --%w", err)
		}
	}

	reqs, label, err := loadTrace(*trace, bench.TraceOptions{Limit: *limit, SessionBlocks: *sessionBlocks})
	if skipMissingTrace(err, *trace, " the replay", log) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bench replay: %w", err)
	}
	reqs = bench.JitterArrivals(reqs, *jitter, o.Seed)
	seats, err := bench.ParseProxies(e2e.proxy)
	if err != nil {
		return fmt.Errorf("bench replay: --%w", err)
	}
	var specs []bench.PolicySpec
	if *policies == "" {
		specs = bench.DefaultPoliciesFor(seats[0])
	} else if specs, err = bench.ParsePolicySpecs(*policies); err != nil {
		return fmt.Errorf("bench replay: %w", err)
	}
	var sweepSpecs []bench.PolicySpec
	switch *sweep {
	case "none", "":
	case "quick":
		sweepSpecs = bench.QuickSweep()
	case "full":
		sweepSpecs = bench.FullSweep()
	default:
		return fmt.Errorf("bench replay: --sweep %q: want none, quick or full", *sweep)
	}
	if *name == "" {
		*name = "replay-" + *mode + "-" + label
		if *mode == "e2e" && !slices.Equal(seats, []string{bench.ProxyHAProxy}) {
			*name = "replay-e2e-" + strings.Join(seats, "-") + "-" + label
		}
		if len(frontCounts) > 0 {
			*name += "-fronts"
		}
	}
	log.Info().Str("trace", *trace).Int("requests", len(reqs)).Str("mode", *mode).Int("policies", len(specs)).
		Int("sweep", len(sweepSpecs)).Msg("bench: replay")

	var rows, sweepRows []bench.Row
	switch *mode {
	case "sim":
		o.Fronts = frontCounts
		if rows, err = bench.RunSim(reqs, label, specs, o); err != nil {
			return fmt.Errorf("bench replay: %w", err)
		}
		if len(sweepSpecs) > 0 {
			so := o
			so.Fronts = nil
			if sweepRows, err = bench.RunSim(reqs, label, sweepSpecs, so); err != nil {
				return fmt.Errorf("bench replay sweep: %w", err)
			}
		}
	case "e2e":
		if len(sweepSpecs) > 0 {
			return errors.New("bench replay: --sweep is for --mode sim (e2e runs take real time)")
		}
		eo := e2e.options(o)
		eo.Fronts, eo.NATSServer = frontCounts, *natsServer
		for _, seat := range seats {
			eo.Proxy = seat
			if ng, njs := eo.NeedsNginx(specs); ng {
				// Like a missing trace: nginx is optional on a bench box.
				if msg := bench.NginxMissing(eo.Nginx, eo.NginxModule, njs); msg != "" {
					log.Warn().Msg("bench: " + msg + ", skipping the nginx e2e replay")
					return nil
				}
			}
		}
		if rows, err = runE2EReplay(reqs, label, specs, seats, eo, e2e, log); err != nil {
			return fmt.Errorf("bench replay: %w", err)
		}
	default:
		return fmt.Errorf("bench replay: --mode %q: want sim or e2e", *mode)
	}
	chart := &bench.ChartOptions{
		Title: fmt.Sprintf("%s replay (%s, %d requests, %d replicas x %.1fM-token cache, compress %g)",
			label, *mode, len(reqs), o.Replicas, float64(o.BlockSize*o.CacheBlocks)/1e6, o.Compress),
		GoalImbalance: 1.1, GoalHitFraction: 0.85,
	}
	if err := bench.Outputs(*out, *name, rows, sweepRows, chart); err != nil {
		return fmt.Errorf("bench replay: %w", err)
	}
	if err := bench.WriteTable(os.Stdout, rows); err != nil {
		return fmt.Errorf("bench replay: %w", err)
	}
	if len(frontCounts) > 0 {
		fmt.Println("\nfronts against one front (goals: hit >= 0.98, TTFT p90/p99 <= 1.05x, requests max/mean <= 1.05):")
		if err := bench.WriteFrontsTable(os.Stdout, rows); err != nil {
			return fmt.Errorf("bench replay: %w", err)
		}
	}
	if len(sweepRows) > 0 {
		fmt.Println("\nsweep:")
		if err := bench.WriteTable(os.Stdout, sweepRows); err != nil {
			return fmt.Errorf("bench replay: %w", err)
		}
	}
	fmt.Printf("\nwrote %s/%s.{txt,csv,md,svg}\n", *out, *name)
	if *check {
		var errs []error
		for _, r := range append(rows, sweepRows...) {
			errs = append(errs, r.Check())
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("bench replay check: %w", err)
		}
	}
	return nil
}

// e2eFlags are the replay flags only the e2e mode reads.
type e2eFlags struct {
	timeScale   float64
	proxy       string
	haproxy     string
	nginx       string
	nginxMode   string
	nginxModule string
	bin         string
	keep        bool
	requestLog  bool
	timeout     time.Duration
}

func defaultE2EFlags(fset *flag.FlagSet) *e2eFlags {
	f := &e2eFlags{}
	fset.Float64Var(&f.timeScale, "time-scale", 0.05, "e2e: mock --time-scale; arrivals are scaled alike so the load shape is kept")
	fset.StringVar(&f.proxy, "proxy", bench.ProxyHAProxy, "e2e: what turnout policies sit behind: haproxy, nginx, or epp (turnout as the Endpoint Picker of an Envoy-like gateway the driver plays: ext_proc full duplex, proxying to the pick); replay: a comma list runs each policy in each seat, e.g. haproxy,epp (haproxy-*/nginx-* rows name their own)")
	fset.StringVar(&f.haproxy, "haproxy", "haproxy", "e2e: haproxy binary")
	fset.StringVar(&f.nginx, "nginx", "nginx", "e2e: nginx binary")
	fset.StringVar(&f.nginxMode, "nginx-mode", "body", "e2e: turnout's nginx_mode behind nginx: body (njs) or header (auth_request, no body)")
	fset.StringVar(&f.nginxModule, "nginx-js-module", nginx.DefaultModulePath, "e2e: njs module for body mode (- = built in)")
	fset.StringVar(&f.bin, "turnout-bin", "", "e2e: turnout binary for serve and render (default: turnout next to this executable, else on $PATH)")
	fset.BoolVar(&f.keep, "keep", false, "e2e: keep the work directory (configs, logs)")
	fset.BoolVar(&f.requestLog, "request-log", false, "e2e: each turnout logs every request (replica, outcome) to requests.log in its stack's directory (with --keep, to read afterwards)")
	fset.DurationVar(&f.timeout, "timeout", 10*time.Minute, "e2e: bound on one policy's replay")
	return f
}

// runCost implements `turnout-lab bench cost`.
func runCost(args []string, log *zerolog.Logger) error {
	fset := cli.NewFlags("bench cost")
	o := bench.CostOptions{Log: log}
	// 2 s x 3 rounds for the 3 route targets and the 8 proxy setups (each
	// also with large bodies, and 1 s at one connection): about 3 minutes.
	fset.DurationVar(&o.Duration, "duration", 2*time.Second, "length of one load run")
	fset.IntVar(&o.Rounds, "rounds", 3, "load runs per target, interleaved across targets")
	fset.IntVar(&o.Conns, "conns", 16, "concurrent connections of the load generator")
	fset.IntVar(&o.WrkThreads, "wrk-threads", 1, "wrk threads (keep low: the box is shared)")
	fset.IntVar(&o.Replicas, "replicas", 4, "replicas (fake for /internal/route, mocks behind the proxies)")
	fset.IntVar(&o.SSEProbes, "sse-probes", 100, "sequential streaming requests per proxy setup for the first-chunk delay")
	fset.IntVar(&o.LargeBody, "large-body", 64<<10, "bytes of the large-body rows' chat bodies (0 = no such rows)")
	fset.DurationVar(&o.LatencyDuration, "latency-duration", time.Second, "length of the 1-connection runs (added latency at light load; 0 = none)")
	fset.IntVar(&o.IdleConns, "idle-conns", 1000, "idle keep-alive connections for the HAProxy memory rows (0 = none)")
	haproxyEnv := fset.String("haproxy-env", "", "space-separated VAR=VALUE: also measure plain HAProxy and the default SPOE render started with them in HAProxy's environment (e.g. GLIBC_TUNABLES=glibc.malloc.trim_threshold=268435456)")
	fset.IntVar(&o.HAProxyNbthread, "haproxy-nbthread", 1, "also measure plain HAProxy and the default SPOE render with this nbthread (0 = no such rows; the ratios are to the best plain row of each round)")
	routeBodies := fset.String("route-body", "", "comma-separated route_body sizes (bytes): also measure the default SPOE render with each, and plain HAProxy at each one's tune.bufsize and at the default render's (\"\" = no such rows)")
	fset.StringVar(&o.Perf, "perf", "", "perf binary: count the proxy's system calls, page faults and context switches per request with perf stat (\"\" = not counted)")
	loadgen := fset.String("loadgen", "auto", "wrk, go, or auto (wrk when installed)")
	policies := fset.String("policies", "prefix-affinity;least-request", "';'-separated policies measured on /internal/route")
	fset.StringVar(&o.ProxyPolicy, "proxy-policy", "prefix-affinity", "turnout policy behind HAProxy and behind nginx in body mode (njs)")
	fset.StringVar(&o.NginxHeaderPolicy, "nginx-header-policy", "session-hash", "turnout policy behind nginx in header mode (auth_request: turnout sees no body)")
	fset.StringVar(&o.HAProxy, "haproxy", "haproxy", `haproxy binary ("" skips the HAProxy rows)`)
	fset.StringVar(&o.Nginx, "nginx", "nginx", `nginx binary ("" skips the nginx rows)`)
	fset.StringVar(&o.NginxModule, "nginx-js-module", nginx.DefaultModulePath, "njs module for the body-mode row (- = built in)")
	bin := fset.String("turnout-bin", "", "turnout binary for serve and render (default: turnout next to this executable, else on $PATH)")
	out := fset.String("out", "bench-out", "output directory")
	name := fset.String("name", "cost", "output file name prefix")
	check := fset.Bool("check", false, "fail unless every run did work with few errors (smoke)")
	keep := fset.Bool("keep", false, "keep the work directory")
	if err := cli.ParseFlags(fset, benchCostCmd, args); err != nil {
		return err
	}
	o.HAProxyEnv = strings.Fields(*haproxyEnv)
	if *routeBodies != "" {
		rb, err := parseInts(*routeBodies)
		if err != nil {
			return fmt.Errorf("bench cost: --route-body: %w", err)
		}
		for _, n := range rb {
			if n < 1024 {
				return fmt.Errorf("bench cost: --route-body %d: below route_body's minimum, 1024", n)
			}
		}
		o.RouteBodies = rb
	}
	for _, p := range strings.Split(*policies, ";") {
		if p = strings.TrimSpace(p); p != "" {
			o.Policies = append(o.Policies, p)
		}
	}
	switch *loadgen {
	case "go":
	case "wrk", "auto":
		p, err := exec.LookPath("wrk")
		if err != nil && *loadgen == "wrk" {
			return fmt.Errorf("bench cost: wrk: %w", err)
		}
		o.Wrk = p
	default:
		return fmt.Errorf("bench cost: --loadgen %q: want wrk, go or auto", *loadgen)
	}
	var err error
	if o.Turnout, o.Lab, err = binaries(*bin); err != nil {
		return fmt.Errorf("bench cost: %w", err)
	}
	work, done, err := workDir("turnout-cost-", *keep, log)
	if err != nil {
		return fmt.Errorf("bench cost: %w", err)
	}
	defer done()
	o.Dir = work
	ctx, stop := cli.StopContext()
	defer stop()
	rows, err := bench.RunCost(ctx, o)
	if err != nil {
		return fmt.Errorf("bench cost: %w", err)
	}
	if err := bench.CostOutputs(*out, *name, rows); err != nil {
		return fmt.Errorf("bench cost: %w", err)
	}
	if err := bench.WriteCostTable(os.Stdout, rows); err != nil {
		return fmt.Errorf("bench cost: %w", err)
	}
	fmt.Printf("\nwrote %s/%s.{txt,csv,md}\n", *out, *name)
	if *check {
		if err := bench.CheckCost(rows); err != nil {
			return fmt.Errorf("bench cost check: %w", err)
		}
	}
	return nil
}

// runTrivial serves the trivial handler the cost benchmark compares
// /internal/route with, until SIGINT/SIGTERM.
func runTrivial(args []string, log *zerolog.Logger) error {
	fset := cli.NewFlags("bench trivial")
	listen := fset.String("listen", "127.0.0.1:9099", "listen address")
	if err := cli.ParseFlags(fset, benchTrivialCmd, args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("bench trivial: %w", err)
	}
	srv := bench.NewTrivialServer()
	ctx, stop := cli.StopContext()
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info().Str("listen", ln.Addr().String()).Msg("bench: trivial handler serving")
	select {
	case err := <-errc:
		return fmt.Errorf("bench trivial: %w", err)
	case <-ctx.Done():
	}
	if err := srv.Shutdown(); err != nil {
		return fmt.Errorf("bench trivial: %w", err)
	}
	return nil
}

// options turns the flags into E2EOptions (all but the binaries and the
// work directory, which runE2EReplay fills).
func (f *e2eFlags) options(o bench.SimOptions) bench.E2EOptions {
	return bench.E2EOptions{
		Sim: o, TimeScale: f.timeScale, Keep: f.keep, Timeout: f.timeout,
		ProxySetup: bench.ProxySetup{Proxy: f.proxy, HAProxy: f.haproxy, Nginx: f.nginx, NginxMode: f.nginxMode, NginxModule: f.nginxModule, RequestLog: f.requestLog},
	}
}

// prepare resolves the binaries and makes the work directory of an e2e
// run into eo; done removes the directory.
func (f *e2eFlags) prepare(eo *bench.E2EOptions, log *zerolog.Logger) (done func(), err error) {
	if eo.Turnout, eo.Lab, err = binaries(f.bin); err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	if eo.WorkDir, done, err = workDir("turnout-bench-", f.keep, log); err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	eo.Log = log
	return done, nil
}

// runE2EReplay runs the replay through real processes: each spec in each
// seat in turn (a proxy-alone spec once, behind its own proxy), so the
// seats of one policy run close together on a shared machine.
func runE2EReplay(reqs []bench.Request, label string, specs []bench.PolicySpec, seats []string, eo bench.E2EOptions, f *e2eFlags, log *zerolog.Logger) ([]bench.Row, error) {
	done, err := f.prepare(&eo, log)
	if err != nil {
		return nil, err
	}
	defer done()
	ctx, stop := cli.StopContext()
	defer stop()
	var rows []bench.Row
	for _, spec := range specs {
		for i, seat := range seats {
			if spec.IsProxyAlone() && i > 0 {
				break
			}
			eo.Proxy = seat
			rs, err := bench.RunE2E(ctx, reqs, label, []bench.PolicySpec{spec}, eo)
			if err != nil {
				return nil, err
			}
			rows = append(rows, rs...)
		}
	}
	return rows, nil
}

// binaries resolves the two programs a run starts: turnout (serve, render)
// from --turnout-bin, else the turnout next to this executable (make build
// puts both in bin/), else turnout on $PATH; and this executable for the
// mock replicas and the trivial handler.
func binaries(turnoutFlag string) (turnout, lab string, err error) {
	lab, err = os.Executable()
	if err != nil {
		return "", "", fmt.Errorf("find own executable: %w", err)
	}
	if turnoutFlag != "" {
		// Absolute: the harness starts processes in their work directories.
		if turnout, err = filepath.Abs(turnoutFlag); err != nil {
			return "", "", fmt.Errorf("--turnout-bin: %w", err)
		}
		return turnout, lab, nil
	}
	if sib := filepath.Join(filepath.Dir(lab), "turnout"); isExecutable(sib) {
		return sib, lab, nil
	}
	p, err := exec.LookPath("turnout")
	if err != nil {
		return "", "", fmt.Errorf("no turnout binary next to %s nor on $PATH (make build, or --turnout-bin): %w", lab, err)
	}
	return p, lab, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
