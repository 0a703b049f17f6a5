package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// The sync axis of the scale envelope with real processes (docs/scale.md,
// "Per front"): one nats-server, N `turnout serve` processes with cluster
// sync before the same cheap mock replicas (this process), and a driver
// asking for decisions over /internal/route, round robin over the fronts,
// at a fixed total rate (open loop), each decision closed over
// /internal/done after a hold. Per rate, after a rest window (each
// front's idle CPU) and a warm-up, a steady window gives per front and per
// decision of the cluster: NATS messages and bytes (turnout's cluster
// counters), CPU (/proc/PID/stat), and routing quality: the hit ratio the
// driver computes from which replica each prompt chunk was last sent to,
// and requests max/mean over the replicas. The sim (`bench replay --mode
// sim --fronts`) measures the same sync in one thread without the box's
// noise; this bench is what the processes, NATS and the box add.

// SyncFrontsOptions chooses the cells of RunSyncFronts.
type SyncFrontsOptions struct {
	Turnout    string // turnout binary (required)
	NATSServer string // nats-server binary, started once per front count above 1
	// NATSURL, when set, is a running nats-server to use instead.
	NATSURL  string
	Dir      string // the processes' configs and logs
	Log      *zerolog.Logger
	Fronts   []int
	Rates    []int // decisions per second, all fronts together
	Replicas int
	// Trace gives the prompts (cycled, each pass with fresh chunk ids);
	// PromptKiB cuts each prompt to about that size (0: whole).
	Trace     []Request
	PromptKiB int
	// Rest measures each front's idle CPU; Warmup runs at the rate before
	// the Window that is measured.
	Rest, Warmup, Window time.Duration
	// Hold is how long a decision stays open before /internal/done.
	Hold time.Duration
	// Workers bounds the driver's requests in flight.
	Workers int
}

// DefaultSyncFrontsOptions are the grid of docs/scale.md.
func DefaultSyncFrontsOptions() SyncFrontsOptions {
	return SyncFrontsOptions{
		Fronts:    []int{1, 2, 4, 8},
		Rates:     []int{1000, 5000, 20000},
		Replicas:  16,
		PromptKiB: 8,
		Rest:      3 * time.Second,
		Warmup:    3 * time.Second,
		Window:    10 * time.Second,
		Hold:      100 * time.Millisecond,
		Workers:   256,
	}
}

// SyncFrontsRow is one front count at one rate.
type SyncFrontsRow struct {
	Fronts, Rate int
	// Reached is the decisions per second the driver got answered in the
	// window; Late the share it sent more than 10 ms after their time (the
	// driver or the box is the limit); Errors failed decisions.
	Reached, Late float64
	Errors        int64
	// Per decision of the cluster: messages and payload bytes all fronts
	// sent; per front (mean over fronts) messages and bytes received and
	// peer decisions applied.
	MsgsOut, BytesOut        float64
	MsgsIn, BytesIn, Applied float64
	// Dropped is the share of decisions the fronts did not publish
	// (their queue full, NATS down or refusing); SlowDropped the peers'
	// messages per decision per front the NATS client dropped at a front
	// that fell behind (a slow consumer).
	Dropped, SlowDropped         float64
	CPUUs, CPUMaxUs, IdleCoresFr float64 // CPU per decision per front (mean, max); a front's idle cores
	// SyncUs is a front's CPU per decision of the cluster beyond its share
	// of one front's (both less their idle CPU): what the sync costs it;
	// 0 when one front's row reached another rate.
	SyncUs float64
	// DriverCores is this process's CPU (driver and mock replicas);
	// NATSUs nats-server's CPU per decision (0: not started here).
	DriverCores, NATSUs float64
	// Hit is the share of prompt chunks that went to the replica that
	// last got them (leading chunks only); LoadReq requests max/mean.
	Hit, HitVs1, LoadReq float64
	Err                  string
	// cpu1 is a one-front row's CPU per decision less its idle CPU (for
	// SyncUs of the rows after it).
	cpu1 float64
}

// RunSyncFronts measures each front count at each rate.
func RunSyncFronts(ctx context.Context, o SyncFrontsOptions) ([]SyncFrontsRow, error) {
	if o.Log == nil {
		l := zerolog.Nop()
		o.Log = &l
	}
	if len(o.Trace) == 0 || len(o.Fronts) == 0 || len(o.Rates) == 0 || o.Replicas < 1 || o.Window <= 0 {
		return nil, fmt.Errorf("bench sync: a trace, fronts, rates, replicas and a window are required")
	}
	o.Workers = max(o.Workers, 1)
	prompts := newSyncPrompts(o.Trace, o.PromptKiB)
	var rows []SyncFrontsRow
	phase := 0
	for _, n := range o.Fronts {
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
		got, err := syncFrontsCell(ctx, o, prompts, n, &phase)
		if err != nil {
			msg, _, _ := strings.Cut(err.Error(), "\n")
			got = append(got, SyncFrontsRow{Fronts: n, Err: msg})
		}
		rows = append(rows, got...)
	}
	fillSyncBase(rows)
	return rows, nil
}

// fillSyncBase sets SyncUs and HitVs1 of each multi-front row from the
// one-front row at the same rate.
func fillSyncBase(rows []SyncFrontsRow) {
	for i := range rows {
		r := &rows[i]
		if r.Fronts < 2 || r.Err != "" {
			continue
		}
		for j := range rows {
			b := &rows[j]
			if b.Fronts != 1 || b.Rate != r.Rate || b.Err != "" {
				continue
			}
			// Per-decision CPU falls as a process's rate rises (its
			// batches fill, its wake-ups amortise): compare at one rate.
			if math.Abs(b.Reached-r.Reached) <= 0.1*r.Reached {
				r.SyncUs = r.cpuLessIdle() - b.cpu1/float64(r.Fronts)
			}
			if b.Hit > 0 {
				r.HitVs1 = r.Hit / b.Hit
			}
			break
		}
	}
}

func (r *SyncFrontsRow) cpuLessIdle() float64 {
	if r.Reached <= 0 {
		return 0
	}
	return r.CPUUs - r.IdleCoresFr*1e6/r.Reached
}

// syncFrontsCell starts n fronts and runs every rate through them.
func syncFrontsCell(ctx context.Context, o SyncFrontsOptions, prompts *syncPrompts, n int, phase *int) ([]SyncFrontsRow, error) {
	dir := filepath.Join(o.Dir, fmt.Sprintf("sync-%dfronts", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	reps, eps, err := startReplicas(o.Replicas)
	defer closeReplicas(reps)
	if err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	ps := &procSet{}
	defer ps.stopAll()
	natsURL, natsPid := o.NATSURL, 0
	if n > 1 && natsURL == "" {
		bin, err := NATSBinary(o.NATSServer)
		if err != nil {
			return nil, err
		}
		if natsURL, err = startNATS(ctx, ps, dir, bin); err != nil {
			return nil, err
		}
		natsPid = ps.procs[len(ps.procs)-1].cmd.Process.Pid
	}
	if n == 1 {
		natsURL = "" // the baseline: no sync
	}
	urls, pids, err := startFronts(ctx, ps, dir, n, frontOptions{Turnout: o.Turnout, NATS: natsURL, Endpoints: eps})
	if err != nil {
		return nil, err
	}
	// The first seconds after a start (first scrapes and health rounds,
	// the runtime's own warm-up) are not idle: let them pass.
	if err := sleepCtx(ctx, o.Rest); err != nil {
		return nil, err
	}
	idle, err := cpuOver(ctx, pids, o.Rest)
	if err != nil {
		return nil, err
	}
	idleCores := 0.0
	for _, c := range idle {
		idleCores += c.Seconds() / o.Rest.Seconds() / float64(n)
	}
	var rows []SyncFrontsRow
	for _, rate := range o.Rates {
		*phase++
		r, err := syncFrontsPhase(ctx, o, prompts, urls, pids, natsPid, rate, uint64(*phase))
		if err != nil {
			return rows, err
		}
		r.Fronts, r.Rate, r.IdleCoresFr = n, rate, idleCores
		if n == 1 {
			r.cpu1 = r.cpuLessIdle()
		}
		o.Log.Info().Int("fronts", n).Int("rate", rate).Float64("reached", r.Reached).Float64("cpu_us", r.CPUUs).
			Float64("msgs_in", r.MsgsIn).Float64("hit", r.Hit).Float64("load_req", r.LoadReq).Msg("bench: sync fronts")
		rows = append(rows, r)
	}
	return rows, nil
}

// cpuOver is each pid's CPU over d.
func cpuOver(ctx context.Context, pids []int, d time.Duration) ([]time.Duration, error) {
	c0, err := cpuEach(pids)
	if err != nil {
		return nil, err
	}
	if err := sleepCtx(ctx, d); err != nil {
		return nil, err
	}
	c1, err := cpuEach(pids)
	if err != nil {
		return nil, err
	}
	for i := range c1 {
		c1[i] -= c0[i]
	}
	return c1, nil
}

// cpuEach is each process's CPU time so far.
func cpuEach(pids []int) ([]time.Duration, error) {
	out := make([]time.Duration, len(pids))
	for i, p := range pids {
		c, err := procCPU(p)
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// syncSnap is what a window's start and end read.
type syncSnap struct {
	cpu                                         []time.Duration
	self, nats                                  time.Duration
	msgsOut, msgsIn, bytesOut, bytesIn, applied []float64
	decisions, dropped, slow                    float64 // all fronts
	at                                          time.Time
}

func takeSyncSnap(ctx context.Context, urls []string, pids []int, natsPid int) (syncSnap, error) {
	s := syncSnap{at: time.Now()}
	var err error
	if s.cpu, err = cpuEach(pids); err != nil {
		return s, err
	}
	if natsPid != 0 {
		if s.nats, err = procCPU(natsPid); err != nil {
			return s, err
		}
	}
	if s.self, err = procCPU(os.Getpid()); err != nil {
		return s, err
	}
	// All fronts at once, and patiently: a front the driver saturates
	// answers its /metrics behind the decisions queued before it.
	texts, errs := make([]string, len(urls)), make([]error, len(urls))
	var wg sync.WaitGroup
	for f, u := range urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			texts[f], errs[f] = getTextWithin(ctx, u+contract.PathMetrics, 60*time.Second)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("turnout metrics: %w", err)
	}
	for _, text := range texts {
		var mo, mi, bo, bi, ap float64
		for _, x := range ParseProm(text) {
			dir := x.Labels["direction"]
			switch x.Name {
			case "turnout_cluster_messages_total":
				mo, mi = pick(dir, x.Value, mo, mi)
			case "turnout_cluster_bytes_total":
				bo, bi = pick(dir, x.Value, bo, bi)
			case "turnout_decisions_total":
				s.decisions += x.Value
			case "turnout_cluster_decisions_total":
				if strings.HasPrefix(x.Labels["result"], "dropped") {
					s.dropped += x.Value
				}
			case "turnout_cluster_slow_consumer_dropped_total":
				s.slow += x.Value
			case "turnout_cluster_received_total":
				if x.Labels["result"] == "applied" {
					ap = x.Value
				}
			}
		}
		s.msgsOut, s.msgsIn = append(s.msgsOut, mo), append(s.msgsIn, mi)
		s.bytesOut, s.bytesIn = append(s.bytesOut, bo), append(s.bytesIn, bi)
		s.applied = append(s.applied, ap)
	}
	return s, nil
}

func pick(dir string, v, out, in float64) (float64, float64) {
	switch dir {
	case "out":
		return v, in
	case "in":
		return out, v
	}
	return out, in
}

// syncFrontsPhase drives rate decisions a second through the fronts for
// the warm-up and the window, and measures the window.
func syncFrontsPhase(ctx context.Context, o SyncFrontsOptions, prompts *syncPrompts, urls []string, pids []int, natsPid, rate int, phase uint64) (SyncFrontsRow, error) {
	var r SyncFrontsRow
	d := newSyncDriver(o, prompts, urls, rate, phase)
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.run(dctx) }()
	fail := func(err error) (SyncFrontsRow, error) {
		stop()
		<-done
		return r, err
	}
	if err := sleepCtx(ctx, o.Warmup); err != nil {
		return fail(err)
	}
	s0, err := takeSyncSnap(ctx, urls, pids, natsPid)
	if err != nil {
		return fail(err)
	}
	d.measure.Store(true)
	if err := sleepCtx(ctx, o.Window); err != nil {
		return fail(err)
	}
	d.measure.Store(false)
	s1, err := takeSyncSnap(ctx, urls, pids, natsPid)
	stop()
	<-done
	if err != nil {
		return r, err
	}
	secs := s1.at.Sub(s0.at).Seconds()
	// The fronts' own count, read with the counters it divides.
	made := s1.decisions - s0.decisions
	if made <= 0 {
		return r, fmt.Errorf("sync: no decision answered in the window (%d errors: %s)", d.errors.Load(), d.firstErr())
	}
	n := float64(len(urls))
	r.Reached = made / secs
	r.Late = float64(d.late.Load()) / max(1, float64(d.sent.Load()))
	r.Errors = d.errors.Load()
	for f := range urls {
		r.MsgsOut += (s1.msgsOut[f] - s0.msgsOut[f]) / made
		r.BytesOut += (s1.bytesOut[f] - s0.bytesOut[f]) / made
		r.MsgsIn += (s1.msgsIn[f] - s0.msgsIn[f]) / made / n
		r.BytesIn += (s1.bytesIn[f] - s0.bytesIn[f]) / made / n
		r.Applied += (s1.applied[f] - s0.applied[f]) / made / n
		us := (s1.cpu[f] - s0.cpu[f]).Seconds() * 1e6 / made
		r.CPUUs += us / n
		r.CPUMaxUs = max(r.CPUMaxUs, us)
	}
	r.DriverCores = (s1.self - s0.self).Seconds() / secs
	r.NATSUs = (s1.nats - s0.nats).Seconds() * 1e6 / made
	r.Dropped = (s1.dropped - s0.dropped) / made
	r.SlowDropped = (s1.slow - s0.slow) / made / n
	r.Hit, r.LoadReq = d.view.result()
	if r.Errors > 0 {
		r.Err = d.firstErr()
	}
	return r, nil
}

// syncDriver asks the fronts for decisions at a fixed rate.
type syncDriver struct {
	o       SyncFrontsOptions
	urls    []string
	rate    int
	phase   uint64
	prompts *syncPrompts
	routes  []string // each front's /internal/route URL
	names   map[string]int
	c       *fasthttp.Client
	view    *chunkView
	// measure is set during the window: answers then count.
	measure            atomic.Bool
	sent, late, errors atomic.Int64
	errMu              sync.Mutex
	err                string
	doneQ              chan openDecision
}

type openDecision struct {
	url, id string
	at      time.Time
}

func newSyncDriver(o SyncFrontsOptions, prompts *syncPrompts, urls []string, rate int, phase uint64) *syncDriver {
	d := &syncDriver{
		o: o, prompts: prompts, urls: urls, rate: max(rate, 1), phase: phase, names: map[string]int{},
		// Deciders and closers share it; a burst waits for a connection.
		c:     &fasthttp.Client{MaxConnsPerHost: o.Workers + closers(o.Workers), MaxConnWaitTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second},
		view:  newChunkView(o.Replicas),
		doneQ: make(chan openDecision, 1<<16),
	}
	for _, u := range urls {
		d.routes = append(d.routes, u+contract.PathRoute)
	}
	for i := range o.Replicas {
		d.names[fmt.Sprintf("r%d", i)] = i
	}
	return d
}

func (d *syncDriver) fail(msg string) {
	d.errors.Add(1)
	d.errMu.Lock()
	if d.err == "" {
		d.err = msg
	}
	d.errMu.Unlock()
}

func (d *syncDriver) firstErr() string {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	return d.err
}

// run sends until ctx ends, then closes every decision still open.
func (d *syncDriver) run(ctx context.Context) {
	var closing sync.WaitGroup
	for range closers(d.o.Workers) {
		closing.Add(1)
		go func() { defer closing.Done(); d.closeLoop() }()
	}
	pacedWorkers(ctx, d.o.Workers, float64(d.rate), func() func(int64, time.Time, *fasthttp.Request, *fasthttp.Response) {
		var body []byte
		var ids []uint64
		return func(i int64, due time.Time, req *fasthttp.Request, resp *fasthttp.Response) {
			if time.Since(due) > 10*time.Millisecond {
				d.late.Add(1)
			}
			d.sent.Add(1)
			body, ids = d.decide(req, resp, int(i), body, ids)
		}
	})
	close(d.doneQ)
	closing.Wait()
}

// decide sends decision i and queues its close.
func (d *syncDriver) decide(req *fasthttp.Request, resp *fasthttp.Response, i int, body []byte, ids []uint64) ([]byte, []uint64) {
	k, pass := i%len(d.o.Trace), uint64(i/len(d.o.Trace))
	// Each pass over the trace (and each phase) gets a prefix of its own:
	// the same sharing, never a prefix an earlier pass left.
	salt := fleet.Mix64(d.phase<<32 | pass)
	ids = ids[:0]
	for _, id := range d.o.Trace[k].HashIDs[:d.prompts.chunks[k]] {
		ids = append(ids, id^salt)
	}
	body = d.prompts.body(body[:0], k, salt)
	f := i % len(d.urls)
	url := d.urls[f]
	req.Reset()
	req.SetRequestURI(d.routes[f])
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set(contract.HdrOriginalURI, "/v1/chat/completions")
	req.Header.Set(contract.HdrOriginalMethod, fasthttp.MethodPost)
	req.SetBodyRaw(body)
	if err := d.c.DoTimeout(req, resp, 10*time.Second); err != nil {
		d.fail(err.Error())
		return body, ids
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		d.fail(fmt.Sprintf("status %d: %.200s", resp.StatusCode(), resp.Body()))
		return body, ids
	}
	rep, ok := d.names[string(resp.Header.Peek(contract.HdrServer))]
	id := string(resp.Header.Peek(contract.HdrDecision))
	if !ok || id == "" {
		d.fail(fmt.Sprintf("answer without a known server (%q) or decision id", resp.Header.Peek(contract.HdrServer)))
		return body, ids
	}
	measured := d.measure.Load()
	d.view.sent(ids, rep, measured)
	d.doneQ <- openDecision{url: url, id: id, at: time.Now().Add(d.o.Hold)}
	return body, ids
}

// syncPrompts are the trace's prompt texts, cut, built once: a
// decision's body is its text behind a word of its pass (block hashes are
// chained, so the word makes every block the pass's own).
type syncPrompts struct {
	texts  [][]byte
	chunks []int // hash ids the cut text covers
	output []int
}

func newSyncPrompts(trace []Request, kib int) *syncPrompts {
	p := &syncPrompts{texts: make([][]byte, len(trace)), chunks: make([]int, len(trace)), output: make([]int, len(trace))}
	for i, tr := range trace {
		if kib > 0 {
			tr.InputTokens = min(tr.InputTokens, kib<<10/(wordLen+1))
		}
		p.texts[i] = AppendPromptText(nil, &tr)
		p.chunks[i] = min(len(tr.HashIDs), (tr.InputTokens+BlockTokens-1)/BlockTokens)
		p.output[i] = tr.OutputTokens
	}
	return p
}

// body appends request k's chat body in the pass of salt.
func (p *syncPrompts) body(dst []byte, k int, salt uint64) []byte {
	dst = append(dst, `{"model":"llama","messages":[{"role":"`+userRole+`","content":"`...)
	dst = strconv.AppendUint(dst, salt, 36)
	dst = append(dst, ' ')
	dst = append(dst, p.texts[k]...)
	dst = append(dst, `"}],"max_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.output[k]), 10)
	return append(dst, '}')
}

// closers is how many goroutines close decisions for workers deciders.
func closers(workers int) int { return max(4, workers/8) }

// closeLoop closes the queued decisions when their hold is over.
func (d *syncDriver) closeLoop() {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for od := range d.doneQ {
		time.Sleep(time.Until(od.at))
		req.Reset()
		req.SetRequestURI(od.url + contract.PathDone + "?id=" + od.id)
		req.Header.SetMethod(fasthttp.MethodPost)
		if err := d.c.DoTimeout(req, resp, 10*time.Second); err != nil {
			d.fail("done: " + err.Error())
		}
	}
}

// chunkView stands for the replicas' prefix caches: each prompt chunk is
// where it was last sent, and a decision hits the leading chunks its
// replica was the last to get.
type chunkView struct {
	mu          sync.Mutex
	last        map[uint64]int
	hit, chunks int64
	reqs        []int64
}

func newChunkView(replicas int) *chunkView {
	return &chunkView{last: map[uint64]int{}, reqs: make([]int64, replicas)}
}

func (v *chunkView) sent(ids []uint64, rep int, measured bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	lead := true
	for _, id := range ids {
		at, ok := v.last[id]
		lead = lead && ok && at == rep
		if measured && lead {
			v.hit++
		}
		v.last[id] = rep
	}
	if measured {
		v.chunks += int64(len(ids))
		v.reqs[rep]++
	}
}

// result is the window's hit ratio and requests max/mean.
func (v *chunkView) result() (hit, loadReq float64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.chunks > 0 {
		hit = float64(v.hit) / float64(v.chunks)
	}
	var sum int64
	for _, n := range v.reqs {
		sum += n
	}
	if sum > 0 {
		loadReq = float64(slices.Max(v.reqs)) * float64(len(v.reqs)) / float64(sum)
	}
	return hit, loadReq
}

// WriteSyncFrontsTable renders the rows.
func WriteSyncFrontsTable(w io.Writer, rows []SyncFrontsRow) error {
	return writeTable(w, "fronts\trate\treached/s\tlate\tmsgs out/dec\tB out/dec\tmsgs in/dec/front\tB in/dec/front\tapplied/dec/front\tdropped\tslow drops/dec/front\tCPU µs/dec/front\tmax\tidle cores/front\tsync µs/dec/front\tnats µs/dec\tdriver cores\thit\tvs 1\treq max/mean\terror\t", len(rows), func(tw io.Writer, i int) {
		r := &rows[i]
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.3f\t%.2f\t%.0f\t%.2f\t%.0f\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%.3f\t%s\t%.1f\t%.2f\t%.3f\t%s\t%.3f\t%s\t\n",
			r.Fronts, r.Rate, r.Reached, r.Late, r.MsgsOut, r.BytesOut, r.MsgsIn, r.BytesIn, r.Applied, r.Dropped, r.SlowDropped, r.CPUUs, r.CPUMaxUs,
			r.IdleCoresFr, syncCell(r), r.NATSUs, r.DriverCores, r.Hit, ratioCell(r.HitVs1), r.LoadReq, r.Err)
	})
}

func syncCell(r *SyncFrontsRow) string {
	if r.Fronts < 2 || r.SyncUs == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", r.SyncUs)
}
