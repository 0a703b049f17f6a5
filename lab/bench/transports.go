package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/contract"
)

// The transport benchmark: what one decision costs turnout through each of
// its transports, with the same bodies, in the same run. One turnout
// process serves /internal/route, the SPOE agent and the Endpoint Picker
// (h2c); a second serves the Endpoint Picker with its default self-signed
// TLS. Each transport is driven directly by a closed loop of its own
// client (no proxy, no replica), and turnout's CPU time over the run is
// divided by the decisions it answered. The HTTP and SPOE clients close
// their decisions over the feedback path as the proxies do
// (transportfeedback.go); a trivial fasthttp server (trivial.go), started
// and pinned like turnout, answers the same HTTP client as the floor any
// fasthttp server pays.

// TransportOptions configure RunTransports.
type TransportOptions struct {
	Turnout string // turnout binary
	// Lab is the turnout-lab binary that serves the trivial row ("": no
	// trivial row).
	Lab string
	// Open is how many decisions each HTTP and SPOE client keeps open
	// (requests still running) before closing its oldest over the
	// feedback path: 0 closes each as soon as it is answered; negative
	// never closes one.
	Open int
	// Baseline is another turnout binary measured in the same run (a row
	// of its own per transport, each right after Turnout's); "" for none.
	Baseline string
	// EPPServer and BaselineEPPServer are each binary's epp.server ("":
	// the binary's default).
	EPPServer, BaselineEPPServer string
	// Duration of one load run; every target gets Rounds runs, interleaved.
	Duration time.Duration
	Rounds   int
	// Conns is the clients' concurrency: connections for HTTP and SPOE,
	// concurrent streams for the Endpoint Picker.
	Conns int
	// GRPCConns is how many gRPC connections carry the Endpoint Picker's
	// streams (Envoy opens one per worker thread).
	GRPCConns int
	Replicas  int
	Policy    string
	Dir       string
	Log       *zerolog.Logger
	// PromptKiB is every body's size (0: half 2 KiB, half 8 KiB).
	PromptKiB int
	// Paced, when above 0, runs each target once more after the rounds,
	// paced at that fraction of its decisions per core (from its CPU per
	// decision), for the latency at a known load.
	Paced float64
	// TurnoutCPUs, when set (a taskset list: "1", "2-3"), runs the turnout
	// processes on those CPUs only (their Go runtime sizes GOMAXPROCS to
	// them). The bench itself must then run on other CPUs (taskset -c 0
	// turnout-lab ...), so the load generator's scheduling stays out of
	// turnout's latencies; RunTransports refuses an overlap.
	TurnoutCPUs string
	// Pacer is the paced HTTP rows' sender: PacerSpin (spinPaced: no Go
	// timers, one spinning goroutine; needs the bench's own CPU) or
	// PacerTimer (pacedLoop, every other row's; the default).
	Pacer string
	// FIFO, when above 0, runs the started processes (turnout's and the
	// trivial server) under SCHED_FIFO at that priority (chrt -f), so no
	// other task's time slice delays them on their CPUs. They sleep
	// between requests; a closed-loop round keeps them busy, so with
	// kernel.sched_rt_runtime_us at its default the kernel throttles them
	// for the rest of each second past 95 %.
	FIFO int
	// GOMAXPROCS, when above 0, is the started processes' GOMAXPROCS
	// (their Go runtime's default is the CPUs they may run on).
	GOMAXPROCS int
}

// The paced HTTP rows' senders (TransportOptions.Pacer). PacerFIFO is
// spinPaced's loop on a SCHED_FIFO thread that sleeps until its next send
// or answer instead of spinning (a spinning real-time thread would starve
// its CPU), so other tasks on the bench's CPU cannot delay it either.
const (
	PacerSpin  = "spin"
	PacerTimer = "timer"
	PacerFIFO  = "fifo"
)

// pacerFIFOPriority is PacerFIFO's real-time priority.
const pacerFIFOPriority = 50

// TransportRow is one transport's figures, medians over rounds.
type TransportRow struct {
	Target   string
	Conns    int
	Requests int
	Errors   int
	RPS      float64
	P50, P99 float64 // ms
	// CPUPerDecision is turnout's CPU time (user + system) per answered
	// decision, in µs.
	CPUPerDecision float64
	// CPURatio is CPUPerDecision against the SPOE row's of the same
	// binary, per round, median; CPURatioMin and CPURatioMax its spread.
	CPURatio, CPURatioMin, CPURatioMax float64
	// TrivialRatio is CPUPerDecision against the trivial fasthttp row's,
	// per round, median (0 without that row).
	TrivialRatio float64
	// PerCore is decisions per CPU-second of turnout: 1e6 / CPUPerDecision.
	PerCore float64
	// PacedRPS, PacedP50, PacedP99 and PacedP999 (ms) are the paced
	// run's (Paced), from each request's intended send time;
	// PacedLateP99 (ms) is the client's own part, how late it sent;
	// PacedCPU turnout's CPU per decision (µs) at that rate; PacedQueued
	// the share of sends that waited for a free connection (spin pacer).
	PacedRPS, PacedP50, PacedP99, PacedP999, PacedLateP99, PacedCPU, PacedQueued float64
	// ServerP50 and ServerP99 (µs) are turnout's own decision time over
	// the paced run (decisiontime.go), ServerOver100 the share of its
	// timed decisions over 100 µs, ServerTimed how many it timed (0: no
	// figures, as for the trivial row).
	ServerP50, ServerP99, ServerOver100 float64
	ServerTimed                         int
	// Stalls is the VM stall probe of TurnoutCPUs and the bench's own
	// (stallprobe.go) just before the paced run, for as long.
	Stalls   []StallProbe
	FirstErr string

	roundRPS, roundCPU, roundP50, roundP99 []float64
}

// Transport target names; the SPOE row is what CPURatio compares with.
// The baseline binary's rows carry BaselineSuffix.
const (
	TransportRoute   = "/internal/route (HTTP/1.1)"
	TransportSPOE    = "SPOE agent (TCP)"
	TransportEPP     = "Endpoint Picker (ext_proc, h2c)"
	TransportEPPTLS  = "Endpoint Picker (ext_proc, TLS self-signed)"
	TransportTrivial = "trivial fasthttp handler (HTTP/1.1)"
	BaselineSuffix   = ", baseline"
)

// transportTarget is one transport: a process whose CPU is counted and a
// worker factory (one per concurrent client).
type transportTarget struct {
	name string
	pid  int
	spoe string // the SPOE row of the same binary
	// metrics is the listen address of the turnout answering this row,
	// whose /metrics times its decisions ("": none, the trivial row).
	metrics string
	// worker returns one client's decide function; i is the request number.
	// A worker's close function returns once its decisions are closed.
	worker func(w int) (func(i int) error, func(), error)
	// spin, when set, runs the paced load with spinPaced (HTTP rows).
	spin func(ctx context.Context, conns int, rate float64, d time.Duration) (*LoadResult, error)
}

// RunTransports measures every transport Rounds times, interleaved.
func RunTransports(ctx context.Context, o TransportOptions) ([]TransportRow, error) {
	if o.Log == nil {
		l := zerolog.Nop()
		o.Log = &l
	}
	if o.Rounds < 1 || o.Conns < 1 || o.Duration <= 0 || o.GRPCConns < 1 {
		return nil, errors.New("transports: rounds, conns, grpc conns and duration must be positive")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("transports dir: %w", err)
	}
	spec, err := ParsePolicySpec(o.Policy)
	if err != nil {
		return nil, err
	}
	if err := checkPinning(o.TurnoutCPUs); err != nil {
		return nil, err
	}
	if o.Pacer == "" {
		o.Pacer = PacerTimer
	}
	if o.Pacer != PacerSpin && o.Pacer != PacerTimer && o.Pacer != PacerFIFO {
		return nil, fmt.Errorf("transports: pacer %q: want %s, %s or %s", o.Pacer, PacerSpin, PacerTimer, PacerFIFO)
	}
	var ps procSet
	defer ps.stopAll()
	bodies := CostBodies(64, "llama", 1, false, 1)
	if o.PromptKiB > 0 {
		bodies = CostBodiesSized(64, "llama", 1, false, 1, o.PromptKiB<<10)
	}
	eps := make([]Endpoint, max(o.Replicas, 1))
	for i := range eps {
		eps[i] = Endpoint{Name: "r" + strconv.Itoa(i), Address: "127.0.0.1:" + strconv.Itoa(18000+i)}
	}
	start := func(bin, name, tlsMode, server string) (*proc, map[string]string, error) {
		addrs := map[string]string{}
		for _, k := range []string{"listen", "spoe", "haproxy", "epp"} {
			a, err := freeAddr()
			if err != nil {
				return nil, nil, err
			}
			addrs[k] = a
		}
		fb, err := freeFeedbackPort()
		if err != nil {
			return nil, nil, err
		}
		addrs["feedback"] = "127.0.0.1:" + strconv.Itoa(fb)
		cfg := TurnoutConfig(ConfigOptions{Listen: addrs["listen"], Model: "llama", Policy: spec, Endpoints: eps, DisableHealth: true, DisableEngineMetrics: true,
			Syslog: addrs["feedback"], HAProxyListen: addrs["haproxy"], HAProxySPOE: addrs["spoe"],
			SessionHeaders: []string{"x-session-id"}, EPPListen: addrs["epp"], EPPTLS: tlsMode, EPPServer: server})
		path := filepath.Join(o.Dir, name+".yaml")
		if err := os.WriteFile(path, cfg, 0o644); err != nil {
			return nil, nil, fmt.Errorf("transports config: %w", err)
		}
		p, err := startPinned(ctx, &ps, o, name, addrs["listen"], bin, "serve", "--config", path, "--watch", "0", "--log-level", "warn")
		if err != nil {
			return nil, nil, err
		}
		// The feedback lines carry the token turnout created beside its
		// config, as the rendered log formats do.
		tok, err := os.ReadFile(filepath.Join(o.Dir, config.DefaultFeedbackTokenFile))
		if err != nil {
			return nil, nil, fmt.Errorf("transports: feedback token: %w", err)
		}
		addrs["token"] = strings.TrimSpace(string(tok))
		return p, addrs, nil
	}
	eppConns := func(addr string, useTLS bool) ([]*grpc.ClientConn, error) {
		var ccs []*grpc.ClientConn
		for range o.GRPCConns {
			cc, err := DialEPP(addr, useTLS)
			if err != nil {
				return nil, err
			}
			ccs = append(ccs, cc)
		}
		return ccs, nil
	}
	var conns []*grpc.ClientConn
	defer func() {
		for _, cc := range conns {
			_ = cc.Close()
		}
	}()
	// binaryTargets starts bin's two processes (h2c, TLS) and returns its
	// targets.
	binaryTargets := func(bin, suffix, prefix, server string) ([]transportTarget, error) {
		plain, pa, err := start(bin, prefix+"turnout-h2c", "off", server)
		if err != nil {
			return nil, err
		}
		tlsP, ta, err := start(bin, prefix+"turnout-tls", "self-signed", server)
		if err != nil {
			return nil, err
		}
		h2c, err := eppConns(pa["epp"], false)
		conns = append(conns, h2c...)
		if err != nil {
			return nil, err
		}
		tlsConns, err := eppConns(ta["epp"], true)
		conns = append(conns, tlsConns...)
		if err != nil {
			return nil, err
		}
		spoe := TransportSPOE + suffix
		route := routeTarget(TransportRoute+suffix, plain.cmd.Process.Pid, spoe, pa["listen"], bodies, feedbackTo{pa["feedback"], pa["token"], o.Open}, o.Pacer)
		route.metrics = pa["listen"]
		return []transportTarget{
			route,
			{name: spoe, pid: plain.cmd.Process.Pid, spoe: spoe, metrics: pa["listen"], worker: spoeWorker(pa["spoe"], bodies, feedbackTo{pa["feedback"], pa["token"], o.Open})},
			{name: TransportEPP + suffix, pid: plain.cmd.Process.Pid, spoe: spoe, metrics: pa["listen"], worker: eppWorker(ctx, h2c, bodies)},
			{name: TransportEPPTLS + suffix, pid: tlsP.cmd.Process.Pid, spoe: spoe, metrics: ta["listen"], worker: eppWorker(ctx, tlsConns, bodies)},
		}, nil
	}
	targets, err := binaryTargets(o.Turnout, "", "", o.EPPServer)
	if err != nil {
		return nil, err
	}
	if o.Baseline != "" {
		base, err := binaryTargets(o.Baseline, BaselineSuffix, "baseline-", o.BaselineEPPServer)
		if err != nil {
			return nil, err
		}
		// Each baseline row right after its counterpart: the two see the
		// same moment of a shared machine's load.
		merged := make([]transportTarget, 0, 2*len(targets))
		for k, b := range base {
			merged = append(merged, targets[k], b)
		}
		targets = merged
	}
	if o.Lab != "" {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		p, err := startPinned(ctx, &ps, o, "trivial", addr, o.Lab, "bench", "trivial", "--listen", addr)
		if err != nil {
			return nil, err
		}
		// First: the floor each turnout row is read against.
		targets = append([]transportTarget{routeTarget(TransportTrivial, p.cmd.Process.Pid, TransportSPOE, addr, bodies, feedbackTo{open: -1}, o.Pacer)}, targets...)
	}
	rows := make([]TransportRow, len(targets))
	for i, t := range targets {
		rows[i] = TransportRow{Target: t.name, Conns: o.Conns}
	}
	for r := range o.Rounds {
		for i, t := range targets {
			c0, err := procCPU(t.pid)
			if err != nil {
				return nil, err
			}
			res, err := targetLoop(ctx, t, o.Conns, o.Duration, nil)
			if err != nil {
				return nil, fmt.Errorf("transports %s: %w", t.name, err)
			}
			c1, err := procCPU(t.pid)
			if err != nil {
				return nil, err
			}
			row := &rows[i]
			row.Requests += res.Requests
			row.Errors += res.Errors
			if res.FirstErr != nil && row.FirstErr == "" {
				row.FirstErr = res.FirstErr.Error()
			}
			s := Summarize(Millis(res.Latencies))
			row.roundRPS = append(row.roundRPS, res.RPS())
			row.roundP50 = append(row.roundP50, s.P50)
			row.roundP99 = append(row.roundP99, s.P99)
			cpu := 0.0
			if res.Requests > 0 {
				cpu = float64(c1-c0) / float64(time.Microsecond) / float64(res.Requests)
			}
			row.roundCPU = append(row.roundCPU, cpu)
			o.Log.Info().Int("round", r+1).Str("target", t.name).Float64("rps", res.RPS()).Float64("cpu_us", cpu).Int("errors", res.Errors).Msg("bench: transports")
		}
	}
	for i := range rows {
		row := &rows[i]
		row.RPS, row.CPUPerDecision = median(row.roundRPS), median(row.roundCPU)
		if row.CPUPerDecision > 0 {
			row.PerCore = 1e6 / row.CPUPerDecision
		}
		row.P50, row.P99 = median(row.roundP50), median(row.roundP99)
		ratios := roundRatios(rows, row, targets[i].spoe)
		row.CPURatio = median(ratios)
		if len(ratios) > 0 {
			row.CPURatioMin, row.CPURatioMax = slices.Min(ratios), slices.Max(ratios)
		}
		if tr := roundRatios(rows, row, TransportTrivial); len(tr) > 0 {
			row.TrivialRatio = median(tr)
		}
	}
	if o.Paced > 0 {
		var probeCPUs string
		if o.TurnoutCPUs != "" {
			own, err := benchCPUs()
			if err != nil {
				return nil, err
			}
			probeCPUs = o.TurnoutCPUs + "," + own
		}
		for i, t := range targets {
			row := &rows[i]
			if row.PerCore == 0 {
				continue
			}
			pace := func(ctx context.Context, conns int, rate float64, d time.Duration) (*LoadResult, error) {
				return pacedLoop(ctx, t, conns, rate, d)
			}
			if t.spin != nil {
				pace = t.spin
			}
			if o.TurnoutCPUs != "" {
				// Before the round, not during it: the probe would take
				// the CPU it measures.
				if row.Stalls, err = probeStalls(ctx, probeCPUs, o.Duration); err != nil {
					return nil, fmt.Errorf("transports %s: %w", t.name, err)
				}
				turnoutCPUs, _ := parseCPUList(o.TurnoutCPUs)
				for k := range row.Stalls {
					row.Stalls[k].Bench = !turnoutCPUs[row.Stalls[k].CPU]
				}
			}
			var dt0 Buckets
			if t.metrics != "" {
				if dt0, err = decisionBuckets(ctx, t.metrics); err != nil {
					return nil, fmt.Errorf("transports %s: %w", t.name, err)
				}
			}
			c0, err := procCPU(t.pid)
			if err != nil {
				return nil, err
			}
			res, err := pace(ctx, o.Conns, o.Paced*row.PerCore, o.Duration)
			if err != nil {
				return nil, fmt.Errorf("transports %s paced: %w", t.name, err)
			}
			c1, err := procCPU(t.pid)
			if err != nil {
				return nil, err
			}
			if t.metrics != "" {
				dt1, err := decisionBuckets(ctx, t.metrics)
				if err != nil {
					return nil, fmt.Errorf("transports %s: %w", t.name, err)
				}
				setServerTime(row, dt1.Minus(dt0))
			}
			if res.Requests > 0 {
				row.PacedCPU = float64(c1-c0) / float64(time.Microsecond) / float64(res.Requests)
				row.PacedQueued = float64(res.Queued) / float64(res.Requests+res.Errors)
			}
			lat := Millis(res.Latencies)
			slices.Sort(lat)
			row.PacedRPS, row.PacedP50, row.PacedP99, row.PacedP999 = res.RPS(), Percentile(lat, 50), Percentile(lat, 99), Percentile(lat, 99.9)
			late := Millis(res.Late)
			slices.Sort(late)
			row.PacedLateP99 = Percentile(late, 99)
			row.Errors += res.Errors
			o.Log.Info().Str("target", t.name).Float64("rps", res.RPS()).Float64("p99_ms", row.PacedP99).Float64("late_p99_ms", row.PacedLateP99).Msg("bench: transports paced")
		}
	}
	return rows, nil
}

// setServerTime sets row's server-side figures from the paced run's
// decision time buckets.
func setServerTime(row *TransportRow, run Buckets) {
	p50, n := run.Quantile(0.5)
	if n == 0 {
		return
	}
	p99, _ := run.Quantile(0.99)
	row.ServerP50, row.ServerP99, row.ServerTimed = p50*1e6, p99*1e6, int(n)
	// LatencyBuckets has a 100 µs bound, so the share is exact; NaN if
	// they ever lose it.
	row.ServerOver100 = math.NaN()
	if over, ok := run.Over(100e-6); ok {
		row.ServerOver100 = over
	}
}

// roundRatios is row's CPU per decision against the row named base, round
// by round (none when there is no such row).
func roundRatios(rows []TransportRow, row *TransportRow, base string) []float64 {
	b := slices.IndexFunc(rows, func(r TransportRow) bool { return r.Target == base })
	if b < 0 {
		return nil
	}
	var ratios []float64
	for r := range row.roundCPU {
		if c := rows[b].roundCPU[r]; c > 0 {
			ratios = append(ratios, row.roundCPU[r]/c)
		}
	}
	return ratios
}

// startPinned starts bin with args on o.TurnoutCPUs (when set) and waits
// until it answers /readyz on listen.
func startPinned(ctx context.Context, ps *procSet, o TransportOptions, name, listen, bin string, args ...string) (*proc, error) {
	if o.TurnoutCPUs != "" {
		// taskset execs bin: the pid whose CPU is counted stays bin's.
		args = append([]string{"-c", o.TurnoutCPUs, bin}, args...)
		bin = "taskset"
	}
	if o.FIFO > 0 {
		// chrt execs too; the policy holds across exec and for every
		// thread the process starts.
		args = append([]string{"-f", strconv.Itoa(o.FIFO), bin}, args...)
		bin = "chrt"
	}
	if o.GOMAXPROCS > 0 {
		// env execs too.
		args = append([]string{"GOMAXPROCS=" + strconv.Itoa(o.GOMAXPROCS), bin}, args...)
		bin = "env"
	}
	p, err := ps.start(o.Dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, p, "http://"+listen+contract.PathReadyz, http.StatusOK, startupWait); err != nil {
		return nil, err
	}
	return p, nil
}

// targetLoop runs conns workers of t for d, each sending its next request
// as soon as the last is answered (closed loop), after pace(w) when pace
// is not nil.
func targetLoop(ctx context.Context, t transportTarget, conns int, d time.Duration, pace func(w int) time.Time) (*LoadResult, error) {
	decides := make([]func(int) error, conns)
	for w := range conns {
		f, closeFn, err := t.worker(w)
		if err != nil {
			return nil, err
		}
		defer closeFn()
		decides[w] = f
	}
	return runWorkers(ctx, decides, d, pace)
}

// runWorkers runs one goroutine per decide function for d, each calling
// its function with the request numbers w, w+n, w+2n ... as soon as the
// last call returned, and sums what they counted. When pace is not nil a
// call waits for pace(w), which returns the call's intended send time:
// its latency runs from then, so a call sent late because the last was
// slow counts the delay (open loop, no coordinated omission).
func runWorkers(ctx context.Context, decides []func(int) error, d time.Duration, pace func(w int) time.Time) (*LoadResult, error) {
	var (
		mu  sync.Mutex
		res LoadResult
		wg  sync.WaitGroup
	)
	conns := len(decides)
	start := time.Now()
	deadline := start.Add(d)
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lats := make([]time.Duration, 0, 4096)
			var late []time.Duration
			var n, errs int
			var first error
			for i := w; ctx.Err() == nil; i += conns {
				var due time.Time
				if pace != nil {
					due = pace(w)
				}
				t0 := time.Now()
				if t0.After(deadline) {
					break
				}
				if pace != nil {
					late = append(late, t0.Sub(due))
					t0 = due
				}
				if err := decides[w](i); err != nil {
					errs++
					if first == nil {
						first = err
					}
					continue
				}
				lats = append(lats, time.Since(t0))
				n++
			}
			mu.Lock()
			res.Requests += n
			res.Errors += errs
			res.Latencies = append(res.Latencies, lats...)
			res.Late = append(res.Late, late...)
			if res.FirstErr == nil {
				res.FirstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &res, nil
}

// routeTarget is an HTTP row: routeWorker's closed loop, and spinPaced's
// paced load of the same requests with PacerSpin.
func routeTarget(name string, pid int, spoe, addr string, bodies []CostBody, fbTo feedbackTo, pacer string) transportTarget {
	t := transportTarget{name: name, pid: pid, spoe: spoe, worker: routeWorker(addr, bodies, fbTo)}
	fifo := 0
	if pacer == PacerFIFO {
		fifo = pacerFIFOPriority
	}
	if pacer == PacerSpin || fifo > 0 {
		reqs := make([][]byte, len(bodies))
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		for i := range bodies {
			routeRequest(req, addr, &bodies[i])
			reqs[i] = []byte(req.String())
		}
		t.spin = func(ctx context.Context, conns int, rate float64, d time.Duration) (*LoadResult, error) {
			return spinPaced(ctx, addr, reqs, fbTo, conns, rate, d, fifo)
		}
	}
	return t
}

// routeRequest sets req to body b's /internal/route call with the headers
// the proxy glue sends.
func routeRequest(req *fasthttp.Request, addr string, b *CostBody) {
	req.Reset()
	req.SetRequestURI("http://" + addr + contract.PathRoute)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("X-Session-Id", b.Session)
	req.Header.Set(contract.HdrOriginalURI, mock.PathChat)
	req.Header.Set(contract.HdrOriginalMethod, fasthttp.MethodPost)
	req.SetBodyRaw(b.Body)
}

// routeWorker posts to /internal/route with the headers the proxy glue
// sends (routeRequest), one keep-alive connection per worker, and closes
// the decisions over feedback (newCloser).
func routeWorker(addr string, bodies []CostBody, fbTo feedbackTo) func(int) (func(int) error, func(), error) {
	return func(int) (func(int) error, func(), error) {
		fb, err := newCloser(fbTo)
		if err != nil {
			return nil, nil, err
		}
		hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, NoDefaultUserAgentHeader: true}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		decide := func(i int) error {
			routeRequest(req, addr, &bodies[i%len(bodies)])
			if err := hc.Do(req, resp); err != nil {
				return err
			}
			if resp.StatusCode() != fasthttp.StatusOK || len(resp.Header.Peek(contract.HdrBackend)) == 0 {
				return fmt.Errorf("status %d without a backend: %.200s", resp.StatusCode(), resp.Body())
			}
			return fb.done(resp.Header.Peek(contract.HdrDecision), resp.Header.Peek(contract.HdrServer))
		}
		return decide, func() {
			_ = fb.Close()
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
			hc.CloseIdleConnections()
		}, nil
	}
}

// spoeWorker sends route NOTIFYs over one agent connection per worker and
// closes the decisions over feedback as routeWorker does.
func spoeWorker(addr string, bodies []CostBody, fbTo feedbackTo) func(int) (func(int) error, func(), error) {
	hdrs := make([][]byte, len(bodies))
	for i, b := range bodies {
		hdrs[i] = spoeHeaders("host", "gateway.bench", "content-type", "application/json", "content-length", strconv.Itoa(len(b.Body)), "x-session-id", b.Session)
	}
	return func(w int) (func(int) error, func(), error) {
		fb, err := newCloser(fbTo)
		if err != nil {
			return nil, nil, err
		}
		c, err := dialSPOE(addr)
		if err != nil {
			_ = fb.Close()
			return nil, nil, err
		}
		stream := uint64(w) << 32
		decide := func(i int) error {
			stream++
			ack, err := c.decide(stream, http.MethodPost, mock.PathChat, hdrs[i%len(hdrs)], bodies[i%len(bodies)].Body)
			if err != nil {
				return err
			}
			return fb.done(spoeVar(ack, spoeDecisionVar), spoeVar(ack, spoeServerVar))
		}
		return decide, func() { _ = fb.Close(); _ = c.Close() }, nil
	}
}

// eppWorker runs one ext_proc stream per request, over the worker's share
// of the gRPC connections.
func eppWorker(ctx context.Context, ccs []*grpc.ClientConn, bodies []CostBody) func(int) (func(int) error, func(), error) {
	reqs := make([]eppRequest, len(bodies))
	for i := range bodies {
		reqs[i] = newEPPRequest(&bodies[i])
	}
	return func(w int) (func(int) error, func(), error) {
		c := extprocv3.NewExternalProcessorClient(ccs[w%len(ccs)])
		decide := func(i int) error {
			_, err := eppDecide(ctx, c, reqs[i%len(reqs)], len(bodies[i%len(bodies)].Body))
			return err
		}
		return decide, func() {}, nil
	}
}
