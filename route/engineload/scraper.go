// Package engineload scrapes each endpoint's own Prometheus page (vLLM
// /metrics) on a short interval and publishes the engine-reported load on
// the endpoint (fleet.Endpoint.SetEngineLoad), so that every turnout
// instance in front of the same replicas balances on the same figure, one
// that also counts requests other instances or other clients sent.
package engineload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route"
)

// Result classifies one scrape; keep resultNames in sync.
type Result int32

// Scrape results.
const (
	ResultOK        Result = iota
	ResultConnect          // dial or transport error
	ResultTimeout          // no complete answer within the timeout
	ResultTooLarge         // body over max_bytes
	ResultStatus           // non-200 (a missing page is a 404)
	ResultParse            // not Prometheus text
	ResultNoMetrics        // valid page without vLLM's load gauges
	numResults
	resultNone Result = -1 // before the first scrape
)

var resultNames = [numResults]string{"ok", "connect_error", "timeout", "too_large", "http_status", "parse_error", "no_metrics"}

func (r Result) String() string {
	if r < 0 || r >= numResults {
		return "none"
	}
	return resultNames[r]
}

// Scraper scrapes every endpoint of the server's live snapshot.
type Scraper struct {
	srv *route.Decider
	log *zerolog.Logger
	// client is rebuilt when the timeout or body cap changes (fasthttp
	// reads them when it builds host clients); clientMu guards the swap.
	clientMu  sync.Mutex
	client    *fasthttp.Client
	clientFor [2]int64 // timeout ns, max bytes
	mu        sync.Mutex
	eps       map[string]*target // by endpoint name (names are global)
	// now is replaceable in tests.
	now func() time.Time
	// share splits the scrapes between cluster instances (nil: this
	// instance scrapes every replica); set by SetShare before Run.
	share Share
}

// target is one endpoint's scrape state; the counters survive reloads as
// long as the endpoint name does.
type target struct {
	name    string
	busy    atomic.Bool
	last    atomic.Int32 // Result of the last scrape
	results [numResults]atomic.Uint64
	durNs   atomic.Uint64
	bytes   atomic.Uint64
	// attempts counts scrapes started (tie-break windows).
	attempts atomic.Uint64
	// refetched counts scrapes fetched twice: a completion arrived while
	// the first page was in flight (measure).
	refetched atomic.Uint64
	// Idle backoff (engine_metrics.idle_interval): gap is the number of
	// intervals between scrapes (0 or 1 unless idle), wait the intervals still
	// to skip, seen the endpoints' decision count when the replica was
	// last found idle. Round reads them; the scrape sets them.
	gap, wait atomic.Int64
	seen      atomic.Uint64
	// skipped counts rounds that left this idle replica unscraped.
	skipped atomic.Uint64
	// The owner's shared figures (share.go): eps the replica's pool
	// entries (set each round), sharedAt when figures last arrived (unix
	// ns), sharedNext the owner's gap to its next scrape, sharedSeen the
	// decisions count then; shared counts figures applied, fallback
	// rounds that scraped a replica another instance owns.
	eps                  atomic.Pointer[[]*fleet.Endpoint]
	sharedAt, sharedNext atomic.Int64
	sharedSeen           atomic.Uint64
	shared, fallback     atomic.Uint64
}

// activity is what a request to the replica moves: decisions this
// instance made for it (a counter, so one that came and went is seen) and
// the in-flight counts, its own and its peers'.
func activity(eps []*fleet.Endpoint) (decisions uint64, busy bool) {
	for _, e := range eps {
		decisions += e.State.Decisions.Load()
		busy = busy || e.DecisionMark() != 0 || e.PeerMark() != 0
	}
	return decisions, busy
}

// skip reports whether this round leaves an idle replica unscraped. Any
// request for it since it was found idle ends the backoff at once.
func (t *target) skip(eps []*fleet.Endpoint) bool {
	if t.wait.Load() <= 0 {
		return false
	}
	if d, busy := activity(eps); busy || d != t.seen.Load() {
		t.wait.Store(0)
		t.gap.Store(0)
		return false
	}
	t.wait.Add(-1)
	t.skipped.Add(1)
	return true
}

// backoff sets the gap to the next scrape from what this one found: an
// idle replica's gap doubles up to idle_interval, any other is scraped
// every interval.
func (t *target) backoff(idle bool, decisions uint64, cfg *config.EngineMetricsConfig) {
	if !idle {
		t.gap.Store(0) // found idle again, it is scraped twice before a gap
		t.wait.Store(0)
		return
	}
	most := max(1, int64(cfg.IdleInterval.D()/cfg.Interval.D()))
	g := min(most, max(1, 2*t.gap.Load()))
	t.seen.Store(decisions)
	t.gap.Store(g)
	t.wait.Store(g - 1)
}

// windowScrapes is the length of a recent-decisions window in scrapes.
const windowScrapes = 8

// New returns a scraper for srv; Run starts it.
func New(srv *route.Decider, log *zerolog.Logger) *Scraper {
	if log == nil {
		l := zerolog.Nop()
		log = &l
	}
	return &Scraper{
		srv: srv,
		log: log,
		eps: map[string]*target{},
		now: time.Now,
	}
}

// Run scrapes until ctx ends, following config reloads.
func (s *Scraper) Run(ctx context.Context) {
	cfg := s.srv.Snapshot().Config.EngineMetrics
	t := time.NewTicker(cfg.Interval.D())
	defer t.Stop()
	for {
		s.Round(ctx)
		select {
		case <-ctx.Done():
			s.clearAll()
			return
		case <-t.C:
		}
		if c := s.srv.Snapshot().Config.EngineMetrics; c.Interval != cfg.Interval {
			cfg = c
			t.Reset(cfg.Interval.D())
		}
	}
}

// Round starts one scrape of every endpoint not still busy with the last
// one, in parallel, and returns at once (tests call it directly).
func (s *Scraper) Round(ctx context.Context) {
	snap := s.srv.Snapshot()
	cfg := snap.Config.EngineMetrics
	byName := map[string][]*fleet.Endpoint{}
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			byName[e.Name] = append(byName[e.Name], e)
		}
	}
	s.mu.Lock()
	for n := range s.eps {
		if byName[n] == nil {
			delete(s.eps, n)
		}
	}
	var todo []*target
	for n := range byName {
		t := s.eps[n]
		if t == nil {
			t = &target{name: n}
			t.last.Store(int32(resultNone))
			s.eps[n] = t
		}
		todo = append(todo, t)
	}
	s.mu.Unlock()
	if cfg.Disable {
		for _, eps := range byName {
			for _, e := range eps {
				e.SetEngineLoad(nil)
			}
		}
		return
	}
	share := s.share
	if !cfg.Shared() {
		share = nil
	}
	now := s.now()
	for _, t := range todo {
		eps := byName[t.name]
		t.eps.Store(&eps)
		owned := share == nil || share.Owns(t.name)
		if !owned {
			if t.fresh(now, eps, &cfg) {
				continue
			}
			t.fallback.Add(1)
		}
		if t.busy.Load() || t.skip(eps) {
			continue
		}
		if !t.busy.CompareAndSwap(false, true) {
			continue // a stalled scrape is still within its timeout
		}
		go func() {
			defer t.busy.Store(false)
			l, ok := s.scrapeOne(ctx, t, eps, &cfg)
			if owned && ok && share != nil {
				share.Publish(t.name, l, time.Duration(max(1, t.gap.Load()))*cfg.Interval.D())
			}
		}()
	}
	if share != nil {
		share.Flush()
	}
}

func (s *Scraper) clearAll() {
	for _, p := range s.srv.Snapshot().Pools() {
		for _, e := range p.Endpoints {
			e.SetEngineLoad(nil)
		}
	}
}

// scrapeOne scrapes one endpoint and publishes the result on every pool
// entry with that name; it returns the figures (nil: the scrape failed)
// and false when ctx ended first.
func (s *Scraper) scrapeOne(ctx context.Context, t *target, eps []*fleet.Endpoint, cfg *config.EngineMetricsConfig) (*fleet.EngineLoad, bool) {
	if ctx.Err() != nil {
		return nil, false
	}
	s.startWindow(t, eps)
	start := s.now()
	dec0, _ := activity(eps)
	sc, err := s.measure(t, eps, cfg)
	load, n, res, marks, peers := sc.load, sc.n, sc.res, sc.marks, sc.peers
	dec1, busy := activity(eps)
	t.backoff(res == ResultOK && load.Requests == 0 && !busy && dec1 == dec0, dec0, cfg)
	t.durNs.Add(uint64(s.now().Sub(start)))
	t.bytes.Add(uint64(n))
	t.results[res].Add(1)
	var got *fleet.EngineLoad
	if res == ResultOK {
		got = &load
	}
	s.setLoad(eps, got, marks, peers)
	if prev := Result(t.last.Swap(int32(res))); prev != res {
		// Logged once per state change, not once per scrape.
		switch {
		case res == ResultOK:
			s.log.Info().Str("endpoint", t.name).Str("address", eps[0].Address).Str("was", prev.String()).
				Msg("engine metrics: scraping; policies use the engine-reported load")
		default:
			s.log.Warn().Str("endpoint", t.name).Str("address", eps[0].Address).Str("result", res.String()).Err(err).
				Msg("engine metrics: scrape failing; policies fall back to in-flight counts for this endpoint")
		}
	}
	return got, true
}

// startWindow counts a scrape (or shared figures) and starts a new
// tie-break window every windowScrapes of them (2 s at the default
// 250 ms): long enough to even out request counts, short enough that an
// old burst is forgotten.
func (s *Scraper) startWindow(t *target, eps []*fleet.Endpoint) {
	if t.attempts.Add(1)%windowScrapes == 1 {
		for _, e := range eps {
			e.StartWindow()
		}
	}
}

// setLoad publishes figures on every pool entry of a replica, with the
// marks taken as they arrived (nil load: back to in-flight counts).
func (s *Scraper) setLoad(eps []*fleet.Endpoint, load *fleet.EngineLoad, marks, peers []int64) {
	newAdapter := false
	for i, e := range eps {
		if load == nil {
			e.SetEngineLoad(nil)
			continue
		}
		l := *load
		l.Mark, l.PeerMark = marks[i], peers[i]
		e.SetEngineLoad(&l)
		if load.LoRA != nil {
			old := e.LoRA()
			e.SetLoRA(load.LoRA)
			newAdapter = newAdapter || unlisted(e, load.LoRA) && !sameAdapters(old, load.LoRA)
		}
	}
	if newAdapter {
		s.srv.RefreshModels() // an adapter /v1/models did not list (yet)
	}
}

// scraped is one page and the in-flight marks (this instance's, the
// peers') taken after it arrived.
type scraped struct {
	load         fleet.EngineLoad
	n            int // body bytes read
	res          Result
	marks, peers []int64
}

// measure fetches the page and takes the marks after it arrived: a decision
// made during the scrape is then never counted twice (in the engine's
// figure and in the change since the mark); one the engine had not seen yet
// is under-counted until the next scrape. (Marks taken before the fetch
// would over-count the first.)
//
// A completion that reached turnout during the scrape is ambiguous: if the
// engine still ran it when it built the page, the mark after over-counts
// the endpoint by one until the next scrape (a least-request replica went
// unused through a burst, TestHAProxyLoRA); assuming so when it did not
// under-counts, and flow control let a standard request into the critical
// headroom (TestFlowControlNginx). So such a scrape fetches the page once
// more, after the completion: rare, since the window is the ~1 ms between
// the engine finishing and turnout hearing of it.
func (s *Scraper) measure(t *target, eps []*fleet.Endpoint, cfg *config.EngineMetricsConfig) (scraped, error) {
	sc := scraped{marks: make([]int64, len(eps)), peers: make([]int64, len(eps))}
	for try := 0; ; try++ {
		// Completions during the fetch = in flight before + decisions
		// during - in flight after (a decision racing these reads can make
		// it one off: a needless fetch, or the over-count).
		var before, after int64
		for _, e := range eps {
			before += e.DecisionMark() - int64(e.State.Decisions.Load())
		}
		var err error
		sc.load, sc.n, sc.res, err = s.fetch(eps[0].Address, cfg)
		for i, e := range eps {
			sc.marks[i], sc.peers[i] = e.DecisionMark(), e.PeerMark()
			after += sc.marks[i] - int64(e.State.Decisions.Load())
		}
		if sc.res != ResultOK || before <= after || try == 1 {
			if try == 1 {
				t.refetched.Add(1)
			}
			return sc, err
		}
	}
}

// fetch GETs and parses one page; n is the number of body bytes read.
func (s *Scraper) fetch(addr string, cfg *config.EngineMetricsConfig) (fleet.EngineLoad, int, Result, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + cfg.Path)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	// The body cap is enforced while reading: a 10 MB page is refused
	// after max_bytes, never buffered whole.
	err := s.httpClient(cfg.Timeout.D(), cfg.MaxBytes).DoTimeout(req, resp, cfg.Timeout.D())
	var zero fleet.EngineLoad
	switch {
	case err == nil:
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return zero, cfg.MaxBytes, ResultTooLarge, err
	case errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || isTimeout(err):
		return zero, 0, ResultTimeout, err
	default:
		return zero, 0, ResultConnect, err
	}
	body := resp.Body()
	if sc := resp.StatusCode(); sc != fasthttp.StatusOK {
		return zero, len(body), ResultStatus, fmt.Errorf("GET %s: status %d", cfg.Path, sc)
	}
	load, res, err := Parse(body)
	return load, len(body), res, err
}

// httpClient returns the client for the live timeout and body cap.
func (s *Scraper) httpClient(timeout time.Duration, maxBytes int) *fasthttp.Client {
	s.clientMu.Lock()
	defer s.clientMu.Unlock()
	key := [2]int64{int64(timeout), int64(maxBytes)}
	if s.client == nil || s.clientFor != key {
		if s.client != nil {
			s.client.CloseIdleConnections()
		}
		s.client = &fasthttp.Client{
			Name:                          "turnout-scraper",
			MaxConnsPerHost:               2,
			MaxIdleConnDuration:           10 * time.Second,
			DisableHeaderNamesNormalizing: true,
			MaxResponseBodySize:           maxBytes,
			ReadTimeout:                   timeout,
			WriteTimeout:                  timeout,
		}
		s.clientFor = key
	}
	return s.client
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// LastResult reports the last scrape result of an endpoint ("none" before
// the first), for tests and readiness listings.
func (s *Scraper) LastResult(name string) string {
	s.mu.Lock()
	t := s.eps[name]
	s.mu.Unlock()
	if t == nil {
		return resultNone.String()
	}
	return Result(t.last.Load()).String()
}

// sameAdapters reports whether two reports name the same adapters.
func sameAdapters(a, b *fleet.LoRAState) bool {
	return a != nil && slices.Equal(a.Running, b.Running) && slices.Equal(a.Waiting, b.Waiting)
}

// unlisted reports whether the engine runs an adapter the endpoint's model
// list lacks: the model table must learn it (rare: /v1/models lists every
// adapter vLLM can run).
func unlisted(e *fleet.Endpoint, l *fleet.LoRAState) bool {
	sm := e.ServedModels()
	for _, set := range [2][]string{l.Running, l.Waiting} {
		for _, a := range set {
			if sm == nil || !sm.Serves(a) {
				return true
			}
		}
	}
	return false
}
