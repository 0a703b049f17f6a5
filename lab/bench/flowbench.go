package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/turnout/turnout/route/policy"
)

// Flow control headers the flow benchmark sends (turnout's defaults,
// internal/config flow_control).
const (
	FlowPriorityHeader = "X-Priority"
	FlowTenantHeader   = "X-Tenant-Id"
)

// Classes of the flow benchmark.
const (
	ClassCritical = "critical"
	ClassStandard = "standard"
)

// FlowOptions configure `turnout-lab bench flow`: a trace replayed through
// real processes at given multiples of the replicas' capacity, with two
// classes and several tenants, once per setup (plain HAProxy leastconn,
// turnout without flow control, turnout with it).
type FlowOptions struct {
	// E2E holds the stack and replica model; its Sim.Compress is set per load.
	E2E E2EOptions
	// Loads are offered load as multiples of the estimated capacity.
	Loads []float64
	// CriticalShare is the fraction of requests sent as critical.
	CriticalShare float64
	// Tenants is how many tenants the sessions are spread over.
	Tenants int
}

// FlowRow is one setup at one load.
type FlowRow struct {
	Setup string
	Load  float64
	// Critical and Standard are TTFT in ms at full time scale.
	Critical, Standard Summary
	Errors             int
	// Throughput is completed requests per second at full time scale.
	Throughput float64
}

// FlowSetup is one compared stack.
type FlowSetup struct {
	Name string
	Spec PolicySpec
	// Flow are the deployment's flow_control lines (nil: off).
	Flow []string
}

// FlowSetups are the compared setups for replicas of maxRunning sequences:
// the proxy's plain leastconn (HAProxy, or nginx's least_conn), turnout's least-request without flow control
// (today's behaviour: every request goes to an engine queue at once), and
// with flow control holding at maxRunning per replica, at maxRunning+1
// (one request queued in each engine covers the completion -> feedback ->
// release round trip, in which a slot would idle), and at maxRunning-1
// with a headroom of 1 for critical.
func FlowSetups(maxRunning int, proxy string) []FlowSetup {
	classes := func(headroom int) []string {
		return []string{
			"  classes:",
			"    - {name: " + ClassCritical + ", max_wait: 5m, headroom: " + strconv.Itoa(headroom) + "}",
			"    - {name: " + ClassStandard + ", max_wait: 5m}",
		}
	}
	flow := func(maxLoad, headroom int) []string {
		// The bench's client sets the class and tenant as a trusted ingress would.
		return append([]string{"flow_control:", "  trust: {priority_header: true, tenant_header: true}", "  saturation: {max_load: " + strconv.Itoa(maxLoad) + "}"}, classes(headroom)...)
	}
	lr := PolicySpec{Policy: policy.LeastRequestType}
	plain := HAProxyLeastConn
	if proxy == ProxyNginx {
		plain = NginxLeastConn
	}
	out := []FlowSetup{
		{Name: plain, Spec: PolicySpec{Policy: plain}},
		{Name: "least-request, no flow control", Spec: lr},
		{Name: fmt.Sprintf("least-request + flow (max_load %d)", maxRunning), Spec: lr, Flow: flow(maxRunning, 0)},
		{Name: fmt.Sprintf("least-request + flow (max_load %d)", maxRunning+1), Spec: lr, Flow: flow(maxRunning+1, 0)},
	}
	if maxRunning > 1 {
		out = append(out, FlowSetup{Name: fmt.Sprintf("least-request + flow (max_load %d, critical headroom 1)", maxRunning-1), Spec: lr, Flow: flow(maxRunning-1, 1)})
	}
	return out
}

// MeanService estimates a request's time on a replica at full time scale
// from the timing model, every prompt token uncached (an overestimate
// where prefixes repeat).
func MeanService(reqs []Request, s SimOptions) time.Duration {
	var sum time.Duration
	for i := range reqs {
		r := &reqs[i]
		sum += s.Timing.TTFTOverhead + time.Duration(r.InputTokens)*s.Timing.PerTokenPrefill + time.Duration(r.OutputTokens)*s.Timing.InterTokenLatency
	}
	return sum / time.Duration(max(len(reqs), 1))
}

// CompressFor is the arrival compression that offers load times the
// replicas' capacity (replicas x max running / mean service).
func CompressFor(reqs []Request, s SimOptions, load float64) float64 {
	if len(reqs) < 2 || s.MaxRunning == 0 {
		return 1
	}
	span := reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	capacity := float64(s.Replicas*s.MaxRunning) / MeanService(reqs, s).Seconds()
	offered := float64(len(reqs)) / max(span.Seconds(), 1e-3)
	return load * capacity / offered
}

// AssignClasses marks a deterministic share of requests critical and
// spreads the sessions (or, without one, the requests) over tenants.
func AssignClasses(reqs []Request, criticalShare float64, tenants int) {
	for i := range reqs {
		r := &reqs[i]
		h := fnv.New64a()
		fmt.Fprintf(h, "%d", r.Index)
		r.Class = ClassStandard
		if float64(h.Sum64()%10000) < criticalShare*10000 {
			r.Class = ClassCritical
		}
		key := r.Session
		if key == "" {
			key = strconv.Itoa(r.Index)
		}
		th := fnv.New64a()
		_, _ = io.WriteString(th, key)
		r.Tenant = "t" + strconv.FormatUint(th.Sum64()%uint64(max(tenants, 1)), 10)
	}
}

// RunFlow replays reqs for every load and setup on fresh stacks.
func RunFlow(ctx context.Context, reqs []Request, setups []FlowSetup, o FlowOptions) ([]FlowRow, error) {
	AssignClasses(reqs, o.CriticalShare, o.Tenants)
	var specs []PolicySpec
	for _, s := range setups {
		specs = append(specs, s.Spec)
	}
	if err := o.E2E.validate(specs); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.E2E.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("flow work dir: %w", err)
	}
	if ng, _ := o.E2E.NeedsNginx(specs); ng && o.E2E.NginxMaxBody == 0 {
		// nginx body mode holds the body: the replay's largest must pass.
		o.E2E.NginxMaxBody = BodyLimit(reqs, o.E2E.Sim.Model)
	}
	var rows []FlowRow
	for _, load := range o.Loads {
		eo := o.E2E
		eo.Sim.Compress = CompressFor(reqs, eo.Sim, load)
		for _, s := range setups {
			row, err := flowRow(ctx, reqs, s, load, eo)
			if err != nil {
				return nil, fmt.Errorf("flow %s at %gx: %w", s.Name, load, err)
			}
			eo.Log.Info().Str("setup", s.Name).Float64("load", load).Float64("critical_p90_ms", row.Critical.P90).
				Float64("standard_p90_ms", row.Standard.P90).Float64("throughput", row.Throughput).Int("errors", row.Errors).Msg("bench: flow row")
			rows = append(rows, row)
		}
	}
	return rows, nil
}

func flowRow(ctx context.Context, reqs []Request, s FlowSetup, load float64, o E2EOptions) (FlowRow, error) {
	var (
		ttft map[string][]time.Duration
		span time.Duration
		errs int
	)
	err := withStack(ctx, o, "flow-", s.Spec, s.Flow, func(ctx context.Context, url string) (err error) {
		ttft, span, errs, err = driveClasses(ctx, reqs, DriveOptions{
			URL: url, Model: o.Sim.Model, Compress: o.Sim.Compress, TimeScale: o.TimeScale, Log: o.Log,
		})
		return err
	})
	if err != nil {
		return FlowRow{}, err
	}
	scale := func(ds []time.Duration) Summary {
		ms := Millis(ds)
		for i := range ms {
			ms[i] /= o.TimeScale
		}
		return Summarize(ms)
	}
	row := FlowRow{Setup: s.Name, Load: load, Critical: scale(ttft[ClassCritical]), Standard: scale(ttft[ClassStandard]), Errors: errs}
	if full := span.Seconds() / o.TimeScale; full > 0 {
		row.Throughput = float64(len(ttft[ClassCritical])+len(ttft[ClassStandard])) / full
	}
	return row, nil
}

// driveClasses is Drive without the client-side bound (open loop: a held
// request must not hold back the arrivals after it), keeping TTFT by class.
func driveClasses(ctx context.Context, reqs []Request, o DriveOptions) (map[string][]time.Duration, time.Duration, int, error) {
	tr := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 2048, IdleConnTimeout: 90 * time.Second, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		ttft     = map[string][]time.Duration{}
		errs     int
		firstErr error
		last     time.Time
	)
	start := time.Now()
	factor := o.TimeScale / o.Compress
	for i := range reqs {
		r := &reqs[i]
		due := start.Add(time.Duration(float64(r.Arrival-reqs[0].Arrival) * factor))
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil, 0, 0, fmt.Errorf("replay: %w", ctx.Err())
		case <-time.After(time.Until(due)):
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t, e2e, err := streamOne(ctx, client, o.URL, o, r, due)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			ttft[r.Class] = append(ttft[r.Class], t)
			if end := due.Add(e2e); end.After(last) {
				last = end
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, 0, 0, fmt.Errorf("replay: %w", err)
	}
	if firstErr != nil && o.Log != nil {
		o.Log.Warn().Err(firstErr).Int("errors", errs).Msg("bench: flow replay errors")
	}
	if len(ttft) == 0 {
		return nil, 0, 0, errors.Join(errors.New("replay: no request succeeded"), firstErr)
	}
	return ttft, last.Sub(start), errs, nil
}

// WriteFlowMarkdown writes the rows as a Markdown table.
func WriteFlowMarkdown(w io.Writer, rows []FlowRow) error {
	var err error
	p := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, a...)
		}
	}
	p("| load | setup | critical TTFT p50 / p90 / p99 ms (n) | standard TTFT p50 / p90 / p99 ms (n) | throughput req/s | errors |\n")
	p("|---|---|---|---|---|---|\n")
	for _, r := range rows {
		p("| %gx | %s | %.0f / %.0f / %.0f (%d) | %.0f / %.0f / %.0f (%d) | %.2f | %d |\n", r.Load, r.Setup,
			r.Critical.P50, r.Critical.P90, r.Critical.P99, r.Critical.N, r.Standard.P50, r.Standard.P90, r.Standard.P99, r.Standard.N, r.Throughput, r.Errors)
	}
	return err
}
