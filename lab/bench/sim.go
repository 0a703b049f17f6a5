package bench

import (
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/httpapi"

	"container/heap"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/policy"
)

// SimOptions configure the in-process replay.
type SimOptions struct {
	Replicas int
	// BlockSize and CacheBlocks size each replica's prefix cache (tokens per
	// block, blocks), exactly as `turnout-lab mock --block-size --cache-blocks`.
	BlockSize   int
	CacheBlocks int
	// MaxRunning bounds running sequences per replica (0 = unlimited); the
	// rest wait FIFO, as in the mock and vLLM's max_num_seqs.
	MaxRunning int
	// Timing is the mock's latency model at full scale (TimeScale 1).
	Timing mock.Timing
	// Compress divides trace arrival times (2 = twice the request rate).
	Compress float64
	// Concurrency bounds requests in flight from the client (0 = unlimited);
	// requests over the bound wait and their TTFT includes the wait.
	Concurrency int
	Model       string
	Seed        uint64
	// Parallel runs this many policies at once (RunSim); RouteTime per
	// decision is then inflated by CPU sharing.
	Parallel int
	Log      *zerolog.Logger
	// LoRA is the adapter mix (lora.go; Adapters 0: none).
	LoRA LoRAOptions
	// Fronts replays each turnout policy once per count through that many
	// instances (simfronts.go; empty: one router, no sync), and SyncDelay
	// is how long the cluster sync takes to reach the other fronts.
	Fronts    []int
	SyncDelay time.Duration
	// Split is how requests reach the fronts (split.go: SplitRequest or
	// SplitTurn; "" is SplitRequest), in the sim as in the e2e replay.
	Split string
	// NoFirstToken: the feedback carries no first-token time (a proxy
	// without proxy.first_token_timing), only the headers' time.
	NoFirstToken bool
	// SharedScrapes models engine_metrics.share with --fronts: each
	// replica's engine figures are read by one front (replica i by front
	// i mod N) and reach the others SyncDelay later, marked against their
	// own counts on arrival; off, every front reads every replica at the
	// scrape's instant.
	SharedScrapes bool
	// RouteBody cuts every body turnout routes on to this many bytes, with
	// X-Body-Truncated, as a proxy with that route_body does (0: turnout
	// sees whole bodies).
	RouteBody int
}

// DefaultSimOptions are the replay defaults: four replicas with the mock's
// default timings and prefix caches of 524288 blocks of 16 tokens (8.4M
// tokens each, a DRAM-offloaded cache as in Mooncake). On the Mooncake trace
// that is enough for the replicas together to hold every reused prefix, so
// capacity does not hide routing quality; --cache-blocks 32768 (~0.5M
// tokens, what an 80 GB GPU holds for an 8B model) shows the capacity-bound
// case.
func DefaultSimOptions() SimOptions {
	d := mock.DefaultConfig()
	return SimOptions{
		Replicas:    4,
		BlockSize:   16,
		CacheBlocks: 524288,
		MaxRunning:  32,
		Timing:      mock.Timing{TTFTOverhead: d.TTFTOverhead, PerTokenPrefill: d.PerTokenPrefill, InterTokenLatency: d.InterTokenLatency, TimeScale: 1},
		Compress:    1,
		Concurrency: 256,
		Model:       "llama",
		Seed:        1,
		Parallel:    1,
		LoRA:        DefaultLoRAOptions(),
	}
}

// Validate checks the options.
func (o *SimOptions) Validate() error {
	switch {
	case o.Replicas < 1 || o.Replicas > 256:
		return fmt.Errorf("replicas %d out of range [1, 256]", o.Replicas)
	case o.BlockSize < 1 || o.CacheBlocks < 1:
		return fmt.Errorf("block size %d and cache blocks %d must be positive", o.BlockSize, o.CacheBlocks)
	case o.MaxRunning < 0 || o.Concurrency < 0:
		return errors.New("max running and concurrency must be >= 0")
	case o.Compress <= 0:
		return fmt.Errorf("compress %v must be > 0", o.Compress)
	case o.Timing.TimeScale <= 0:
		return errors.New("sim timing needs a positive time scale")
	case o.SyncDelay < 0:
		return fmt.Errorf("sync delay %v must be >= 0", o.SyncDelay)
	}
	if _, err := ParseSplit(o.Split); err != nil {
		return err
	}
	return o.LoRA.Validate()
}

// ReplicaLoad is what one replica served.
type ReplicaLoad struct {
	Name         string
	Requests     int64
	PromptTokens int64
	CachedTokens int64
	OutputTokens int64
	// TTFTSeconds and TTFTCount are the replica's own time-to-first-token
	// sum and count (e2e: the mock's histogram; its queue wait and
	// prefill, without the proxy path or the client).
	TTFTSeconds float64
	TTFTCount   int64
	// AdapterLoads are the replica's LoRA adapter loads (e2e: the mock's
	// mock_lora_loads_total).
	AdapterLoads int64
}

// RunResult is the raw outcome of one replay with one router.
type RunResult struct {
	Replicas []ReplicaLoad
	// TTFT and E2E run from the request's scheduled arrival (so client-side
	// waiting under the concurrency bound is counted, no coordinated omission),
	// in completion order.
	TTFT, E2E []time.Duration
	Requests  int
	Errors    int
	// Span is from the first arrival to the last completion.
	Span time.Duration
	// RouteTime is the wall time spent in routing decisions (sim only).
	RouteTime time.Duration
	// AdapterLoads counts requests whose adapter was not hot (lora.go).
	AdapterLoads int64
	// ByIndex is each trace request's TTFT by its Index (-1: shed, the
	// router answered 429: ErrShed), for per-class figures (slobench.go).
	ByIndex []time.Duration
	// Shed counts the requests the router refused with 429.
	Shed int
	// SessionMoves counts requests with a session sent to another replica
	// than the session's previous request, of SessionRepeats (requests of
	// a session after its first): how sticky sessions were.
	SessionMoves, SessionRepeats int64
}

// ErrShed is a router's 429: the request is refused, not routed (flow
// control's shed); the sim counts it and moves on.
var ErrShed = errors.New("shed (429)")

// Router chooses a replica per request inside the simulation.
type Router interface {
	// Route returns the replica index and a token for Done.
	Route(r *Request, body []byte) (replica int, token uint64, err error)
	// Done reports the request finished (turnout: the completion feedback).
	Done(token uint64) error
	// NeedsBody reports whether Route reads the body (skip building it otherwise).
	NeedsBody() bool
}

// NewRouter builds the router for spec over n replicas named r0..r(n-1).
func NewRouter(spec PolicySpec, names []string, o SimOptions) (Router, error) {
	return newRouterWith(spec, names, o, nil)
}

// newRouterWith is NewRouter with extra deployment lines (flow_control).
func newRouterWith(spec PolicySpec, names []string, o SimOptions, depYAML []string) (Router, error) {
	switch spec.Policy {
	case HAProxyRoundRobin, NginxRoundRobin:
		return &rrRouter{n: len(names)}, nil
	case HAProxyLeastConn, NginxLeastConn:
		return &lcRouter{conns: make([]int, len(names)), last: -1}, nil
	}
	eps := make([]Endpoint, len(names))
	for i, n := range names {
		// Addresses are never dialled: health checks are off in the sim.
		eps[i] = Endpoint{Name: n, Address: "127.0.0.1:" + strconv.Itoa(18000+i)}
	}
	log := o.Log
	if log == nil {
		l := zerolog.Nop()
		log = &l
	}
	t := &turnoutRouter{names: map[string]int{}, order: names, closeFn: func() error { return nil }, routeBody: o.RouteBody}
	var extra string
	if spec.Policy == policy.KVAwareType {
		var err error
		if extra, t.closeFn, err = kvAwareExtras(spec, o, log); err != nil {
			return nil, fmt.Errorf("policy %s: %w", spec, err)
		}
	}
	cfgText := TurnoutConfig(ConfigOptions{Listen: "127.0.0.1:1", Model: o.Model, Policy: spec, ExtraParams: extra, Endpoints: eps, DisableHealth: true, DeploymentYAML: depYAML,
		RouteBody: o.RouteBody})
	cfg, err := config.ParseConfig(cfgText)
	if err == nil {
		t.srv, err = route.New(cfg, route.Options{Seed: o.Seed, Log: log})
		if err == nil {
			t.api = httpapi.New(t.srv)
		}
	}
	if err == nil && spec.Policy == policy.KVAwareType {
		err = t.attachKVIndex()
	}
	if err != nil {
		_ = t.Close()
		return nil, fmt.Errorf("policy %s: %w", spec, err)
	}
	for i, n := range names {
		t.names[n] = i
	}
	if o.LoRA.Adapters > 0 {
		t.serveAdapters(o.Model, o.LoRA.Adapters)
	}
	return t, nil
}

// Windower is implemented by routers that model turnout's engine scrapes:
// the sim calls StartWindow every ScrapeInterval of virtual time, as the
// scraper does (in-flight counts are exact in the sim, so they stand for the
// engine's running + waiting; only the tie-break window needs modelling).
type Windower interface{ StartWindow() }

// EngineReporter is implemented by routers that read the engines' load
// reports (turnout: vllm:num_requests_running and _waiting, scraped every
// ScrapeInterval); the sim calls it at each modelled scrape. The sim's
// in-flight counts are exact, so the report leaves the load figure as it
// is; it tells the router which replicas queue.
type EngineReporter interface {
	ReportEngine(replica, running, waiting int)
}

// ReportEngine implements EngineReporter.
func (t *turnoutRouter) ReportEngine(replica, running, waiting int) {
	if e := t.endpoint(replica); e != nil {
		e.SetEngineLoad(&fleet.EngineLoad{
			Requests: int64(running + waiting), Waiting: int64(waiting), KVUsage: -1,
			Mark: e.DecisionMark(), PeerMark: e.PeerMark(),
		})
	}
}

// endpoint is replica's endpoint in turnout's pool (by name: the pool's
// order need not be the replicas').
func (t *turnoutRouter) endpoint(replica int) *fleet.Endpoint {
	if replica < 0 || replica >= len(t.order) {
		return nil
	}
	return t.srv.Snapshot().Deployments[0].Serve.EndpointByName([]byte(t.order[replica]))
}

// ScrapeInterval is turnout's default engine_metrics.interval.
const ScrapeInterval = 250 * time.Millisecond

// StartWindow implements Windower; windows span 8 scrapes as in engineload.
func (t *turnoutRouter) StartWindow() {
	t.scrapes++
	if t.scrapes%8 != 1 {
		return
	}
	for _, p := range t.srv.Snapshot().Pools() {
		for _, e := range p.Endpoints {
			e.StartWindow()
		}
	}
}

// turnoutRouter calls the real /internal/route handler in-process, so the sim
// runs exactly the policy code the service runs.
type turnoutRouter struct {
	srv     *route.Decider
	api     *httpapi.API
	names   map[string]int
	order   []string
	ctx     fasthttp.RequestCtx
	kvIndex *kv.Index    // kv-aware only
	closeFn func() error // stops helpers (kv-aware's tokenizer)
	scrapes int
	// routeBody is SimOptions.RouteBody.
	routeBody int
}

// Detail summarizes the policy's decision outcomes from its metrics.
func (t *turnoutRouter) Detail() string {
	var b strings.Builder
	t.srv.WriteMetrics(&b)
	return DecisionDetail(b.String())
}

// Close stops the router's helpers and the policy's goroutines.
func (t *turnoutRouter) Close() error {
	if t.srv != nil {
		t.srv.Close()
	}
	return t.closeFn()
}

func (t *turnoutRouter) NeedsBody() bool { return true }

func (t *turnoutRouter) Route(r *Request, body []byte) (int, uint64, error) {
	ctx := &t.ctx
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.Header.Set(contract.HdrOriginalURI, mock.PathChat)
	ctx.Request.Header.Set(contract.HdrOriginalMethod, fasthttp.MethodPost)
	if r.Session != "" {
		ctx.Request.Header.Set("X-Session-Id", r.Session)
	}
	if r.Class != "" {
		ctx.Request.Header.Set(FlowPriorityHeader, r.Class)
	}
	if n := t.routeBody; n > 0 && len(body) > n {
		ctx.Request.Header.Set(contract.HdrBodyTruncated, strconv.Itoa(n)+"/"+strconv.Itoa(len(body)))
		body = body[:n]
	}
	ctx.Request.SetBodyRaw(body)
	t.api.Handler(ctx)
	if sc := ctx.Response.StatusCode(); sc == fasthttp.StatusTooManyRequests {
		return 0, 0, ErrShed
	} else if sc != fasthttp.StatusOK {
		return 0, 0, fmt.Errorf("route status %d: %s", sc, ctx.Response.Body())
	}
	name := ctx.Response.Header.Peek(contract.HdrServer)
	i, ok := t.names[string(name)]
	if !ok {
		return 0, 0, fmt.Errorf("route named unknown server %q", name)
	}
	id, err := strconv.ParseUint(string(ctx.Response.Header.Peek(contract.HdrDecision)), 16, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("route decision id: %w", err)
	}
	return i, id, nil
}

func (t *turnoutRouter) Done(id uint64) error {
	if !t.srv.Ledger().Complete(id) {
		return fmt.Errorf("decision %016x was not open", id)
	}
	return nil
}

// DoneTTFB implements TTFBReporter: the completion as the proxy's feedback
// line reports it.
func (t *turnoutRouter) DoneTTFB(id uint64, ttfb, firstToken, total time.Duration) error {
	c := route.Completion{Status: 200, Ms: total.Milliseconds(), TTFB: ttfb.Milliseconds(), Retries: 0}
	if firstToken >= 0 {
		c.FirstTokenMs, c.HasFirstToken = firstToken.Milliseconds(), true
	}
	if t.srv.Ledger().CloseDecisionWith(id, c) == nil {
		return fmt.Errorf("decision %016x was not open", id)
	}
	return nil
}

// Clocked is implemented by routers that model time passing between
// calls (the fronts' sync): the sim sets the virtual time before each
// decision and completion.
type Clocked interface{ SetNow(t time.Duration) }

// TTFBReporter is implemented by routers that take the completion's times
// (turnout: the feedback line's TTFB, first-token time and duration, from
// the decision on; firstToken < 0: not timed), which the sim then reports
// instead of calling Done.
type TTFBReporter interface {
	DoneTTFB(token uint64, ttfb, firstToken, total time.Duration) error
}

// rrRouter models HAProxy "balance roundrobin" (and nginx's default round
// robin) with equal weights.
type rrRouter struct{ n, next int }

func (r *rrRouter) NeedsBody() bool { return false }

func (r *rrRouter) Route(*Request, []byte) (int, uint64, error) {
	i := r.next
	r.next = (r.next + 1) % r.n
	return i, uint64(i), nil
}

func (r *rrRouter) Done(uint64) error { return nil }

// lcRouter models HAProxy "balance leastconn": fewest active connections,
// ties taken in rotation after the last pick (HAProxy requeues a picked
// server behind its equals). nginx least_conn also rotates among ties, but
// counts per worker; the sim models one worker.
type lcRouter struct {
	conns []int
	last  int
}

func (r *lcRouter) NeedsBody() bool { return false }

func (r *lcRouter) Route(*Request, []byte) (int, uint64, error) {
	n := len(r.conns)
	best := -1
	for k := 1; k <= n; k++ {
		i := (r.last + k + n) % n
		if best < 0 || r.conns[i] < r.conns[best] {
			best = i
		}
	}
	r.conns[best]++
	r.last = best
	return best, uint64(best), nil
}

func (r *lcRouter) Done(tok uint64) error {
	r.conns[tok]--
	return nil
}

// ReplicaNames returns r0..r(n-1).
func ReplicaNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "r" + strconv.Itoa(i)
	}
	return out
}

// Simulate replays reqs against simulated replicas in virtual time. Events:
// arrivals, admissions (a free running slot), completions. Completions at the
// same instant run before arrivals, so a decision sees the in-flight counts
// of that instant; completions call the router's Done at their virtual time.
func Simulate(reqs []Request, router Router, o SimOptions) (*RunResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	s := &sim{o: o, router: router, lastOf: map[string]int{}}
	s.reps = make([]simReplica, o.Replicas)
	names := ReplicaNames(o.Replicas)
	cw, _ := router.(CacheWatcher)
	for i := range s.reps {
		s.reps[i].cache = mock.NewCache(o.BlockSize, o.CacheBlocks)
		s.reps[i].load.Name = names[i]
		if cw != nil {
			if sink := cw.CacheSink(i); sink != nil {
				s.reps[i].cache.SetSink(sink)
			}
		}
	}
	s.res.TTFT = make([]time.Duration, 0, len(reqs))
	s.res.E2E = make([]time.Duration, 0, len(reqs))
	s.res.ByIndex = make([]time.Duration, 0, len(reqs))
	s.state = make([]simReq, len(reqs))
	for i := range reqs {
		st := &s.state[i]
		st.req = &reqs[i]
		st.arrival = time.Duration(float64(reqs[i].Arrival) / o.Compress)
		s.push(event{t: st.arrival, kind: evArrival, r: st})
	}
	var first, last time.Duration = -1, 0
	for s.q.Len() > 0 {
		ev := heap.Pop(&s.q).(event)
		s.now = ev.t
		var err error
		switch ev.kind {
		case evFinish:
			err = s.finish(ev.r)
			last = max(last, s.now)
		case evArrival:
			if first < 0 {
				first = s.now
			}
			err = s.arrive(ev.r)
		}
		if err != nil {
			return nil, err
		}
	}
	s.res.Requests = len(s.res.TTFT)
	if first >= 0 {
		s.res.Span = last - first
	}
	for i := range s.reps {
		s.res.Replicas = append(s.res.Replicas, s.reps[i].load)
	}
	return &s.res, nil
}

const (
	evFinish  = 0 // before arrivals at the same instant
	evArrival = 1
)

type event struct {
	t    time.Duration
	kind uint8
	seq  uint64
	r    *simReq
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	if q[i].kind != q[j].kind {
		return q[i].kind < q[j].kind
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simReq struct {
	req        *Request
	arrival    time.Duration
	routed     time.Duration // when the router decided
	firstToken time.Duration
	replica    int
	token      uint64
}

type simReplica struct {
	lora    loraSlots
	cache   *mock.Cache
	running int
	waiting []*simReq
	load    ReplicaLoad
}

type sim struct {
	o       SimOptions
	router  Router
	reps    []simReplica
	state   []simReq
	q       eventQueue
	seq     uint64
	now     time.Duration
	pending []*simReq // over the client's concurrency bound, FIFO
	// nextScrape is when the modelled engine scrape starts a new window.
	nextScrape time.Duration
	sent       int // in flight from the client's view
	body       []byte
	tokens     []int32
	res        RunResult
	lastOf     map[string]int // replica of each session's previous request
}

func (s *sim) push(e event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

func (s *sim) arrive(r *simReq) error {
	if s.o.Concurrency > 0 && s.sent >= s.o.Concurrency {
		s.pending = append(s.pending, r)
		return nil
	}
	return s.send(r)
}

// send routes the request and queues it at its replica.
func (s *sim) send(r *simReq) error {
	s.sent++
	var body []byte
	if s.router.NeedsBody() {
		s.body = AppendChatBody(s.body[:0], r.req, BodyOptions{Model: r.req.ModelOr(s.o.Model), Stream: true})
		body = s.body
	}
	if c, ok := s.router.(Clocked); ok {
		// Before the scrape: what reached the fronts by now is in the
		// levels the scrape marks.
		c.SetNow(s.now)
	}
	if s.nextScrape == 0 || s.now >= s.nextScrape {
		if w, ok := s.router.(Windower); ok {
			w.StartWindow()
		}
		if lr, ok := s.router.(LoRAReporter); ok && s.o.LoRA.Adapters > 0 {
			s.reportLoRA(lr)
		}
		if er, ok := s.router.(EngineReporter); ok {
			for i := range s.reps {
				er.ReportEngine(i, s.reps[i].running, len(s.reps[i].waiting))
			}
		}
		s.nextScrape = s.now + ScrapeInterval
	}
	t0 := time.Now()
	i, tok, err := s.router.Route(r.req, body)
	s.res.RouteTime += time.Since(t0)
	if errors.Is(err, ErrShed) {
		s.res.Shed++
		s.setByIndex(r.req.Index, -1)
		return s.sendNext()
	}
	if err != nil {
		return fmt.Errorf("request %d: %w", r.req.Index, err)
	}
	if i < 0 || i >= len(s.reps) {
		return fmt.Errorf("request %d: router chose replica %d of %d", r.req.Index, i, len(s.reps))
	}
	r.replica, r.token, r.routed = i, tok, s.now
	if r.req.Session != "" {
		if prev, ok := s.lastOf[r.req.Session]; ok {
			s.res.SessionRepeats++
			if prev != i {
				s.res.SessionMoves++
			}
		}
		s.lastOf[r.req.Session] = i
	}
	rep := &s.reps[i]
	if s.o.MaxRunning > 0 && rep.running >= s.o.MaxRunning {
		rep.waiting = append(rep.waiting, r)
		return nil
	}
	s.admit(rep, r)
	return nil
}

// admit runs the prefix cache at admission, like the mock (and vLLM's
// scheduler), so a queued request can hit blocks stored while it waited;
// the blocks are keyed by the request's adapter, as the mock's.
func (s *sim) admit(rep *simReplica, r *simReq) {
	rep.running++
	s.tokens = AppendPromptTokens(s.tokens[:0], r.req)
	cached := rep.cache.ServeKeyed(mock.AdapterKey(r.req.Model), s.tokens)
	prompt := len(s.tokens)
	uncached := prompt - cached
	rep.load.Requests++
	rep.load.PromptTokens += int64(prompt)
	rep.load.CachedTokens += int64(cached)
	rep.load.OutputTokens += int64(r.req.OutputTokens)
	var load time.Duration
	if r.req.Model != "" && rep.lora.use(r.req.Model, s.o.LoRA.MaxLoRAs) {
		load = s.o.LoRA.LoRALoadCost
		s.res.AdapterLoads++
	}
	r.firstToken = s.now + load + s.o.Timing.TTFT(uncached)
	s.push(event{t: s.now + load + s.o.Timing.Total(uncached, r.req.OutputTokens), kind: evFinish, r: r})
}

// reportLoRA hands the router each replica's adapters with running and
// waiting requests, as vllm:lora_requests_info reports them.
func (s *sim) reportLoRA(lr LoRAReporter) {
	for i := range s.reps {
		rep := &s.reps[i]
		var running, waiting []string
		for a := range rep.lora.running {
			running = append(running, a)
		}
		seen := map[string]bool{}
		for _, w := range rep.waiting {
			if a := w.req.Model; a != "" && !seen[a] {
				seen[a] = true
				waiting = append(waiting, a)
			}
		}
		slices.Sort(running)
		slices.Sort(waiting)
		lr.ReportLoRA(i, running, waiting, s.o.LoRA.MaxLoRAs)
	}
}

func (s *sim) finish(r *simReq) error {
	rep := &s.reps[r.replica]
	rep.running--
	if r.req.Model != "" {
		rep.lora.done(r.req.Model)
	}
	if c, ok := s.router.(Clocked); ok {
		c.SetNow(s.now)
	}
	var err error
	if tr, ok := s.router.(TTFBReporter); ok {
		// As behind HAProxy or nginx: a stream's headers come at once
		// (vLLM sends them before queueing it), its first body bytes
		// with the first token.
		tft := r.firstToken - r.routed
		if s.o.NoFirstToken {
			tft = -1
		}
		err = tr.DoneTTFB(r.token, 0, tft, s.now-r.routed)
	} else {
		err = s.router.Done(r.token)
	}
	if err != nil {
		return fmt.Errorf("request %d: %w", r.req.Index, err)
	}
	s.res.TTFT = append(s.res.TTFT, r.firstToken-r.arrival)
	s.setByIndex(r.req.Index, r.firstToken-r.arrival)
	// The replica's own TTFT (queue wait and prefill), as the mock's
	// histogram reports it in e2e.
	rep.load.TTFTSeconds += (r.firstToken - r.routed).Seconds()
	rep.load.TTFTCount++
	s.res.E2E = append(s.res.E2E, s.now-r.arrival)
	if len(rep.waiting) > 0 {
		next := rep.waiting[0]
		rep.waiting = rep.waiting[1:]
		s.admit(rep, next)
	}
	return s.sendNext()
}

// sendNext frees the client's slot of a request that ended (answered or
// shed) and sends the oldest request waiting for one.
func (s *sim) sendNext() error {
	s.sent--
	if len(s.pending) > 0 {
		next := s.pending[0]
		s.pending = s.pending[1:]
		return s.send(next)
	}
	return nil
}

// setByIndex records request i's TTFT (-1: shed).
func (s *sim) setByIndex(i int, d time.Duration) {
	for len(s.res.ByIndex) <= i {
		s.res.ByIndex = append(s.res.ByIndex, -1)
	}
	s.res.ByIndex[i] = d
}

// CacheBounds returns two references for the trace's prefix-cache hit
// ratio: with one infinite cache (what no routing can beat) and with one
// LRU cache as large as all replicas together (perfect sharing of the
// finite capacity, same arrival order), both at the replicas' block size.
func CacheBounds(reqs []Request, blockSize, pooledBlocks int) (infinite, pooled float64) {
	seen := make(map[uint64]struct{}, 1<<16)
	pool := mock.NewCache(blockSize, pooledBlocks)
	var tokens []int32
	var total, infHits, poolHits int64
	for i := range reqs {
		tokens = AppendPromptTokens(tokens[:0], &reqs[i])
		total += int64(len(tokens))
		key := mock.AdapterKey(reqs[i].Model)
		poolHits += int64(pool.ServeKeyed(key, tokens))
		parent := key
		prefix := true
		for b := 0; b+blockSize <= len(tokens); b += blockSize {
			parent = mock.HashBlock(parent, tokens[b:b+blockSize])
			if _, ok := seen[parent]; ok && prefix {
				infHits += int64(blockSize)
				continue
			}
			prefix = false
			seen[parent] = struct{}{}
		}
	}
	return Ratio(float64(infHits), float64(total)), Ratio(float64(poolHits), float64(total))
}
