package route

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
	"github.com/turnout/turnout/route/pd"
	"github.com/turnout/turnout/route/policy"
)

// ErrNoEndpoint is returned when no endpoint is available.
var ErrNoEndpoint = errors.New("no available endpoint")

// Options configure a Server.
type Options struct {
	Registry *policy.Registry
	Log      *zerolog.Logger
	// Seed drives policy randomness; 0 picks one at random. Decision ids
	// are random whatever the seed (unguessable, see decisions.go).
	Seed uint64
	// DecisionSlots bounds tracked in-flight decisions (default 1<<16).
	DecisionSlots int
}

// Server holds the live snapshot and answers /internal/route.
type Server struct {
	log   *zerolog.Logger
	reg   *policy.Registry
	seed  uint64
	snap  atomic.Pointer[Snapshot]
	mu    sync.Mutex // serializes Apply
	store *stateStore
	pols  []fleet.Policy
	dec   *decisions
	// budget counts request body bytes held across in-flight requests.
	budget bodyBudget
	pool   sync.Pool
	m      serverMetrics
	pd     *pd.Client
	// ctx ends background work owned by policies (KV subscriptions).
	ctx    context.Context
	cancel context.CancelFunc
	// onApply hooks run after every accepted snapshot (e.g. KV subscribers).
	onApply []func(*Snapshot)
	// sink receives prefix decisions for other instances (cluster sync).
	sink atomic.Pointer[sinkBox]
	// kvHub owns bound KV-event sockets, shared by every pool using them.
	kvHub *kv.Hub
	// healthRound is set once a full round of health checks has finished.
	healthRound atomic.Bool
	// observe, when set (tests), sees each request's Request as the handler
	// returns: the proof that the body is scanned once.
	observe func(*fleet.Request)

	feedbackHealth // feedback_health.go
}

// NewServer builds a server from a validated config.
func NewServer(cfg *config.Config, opts Options) (*Server, error) {
	if opts.Registry == nil {
		opts.Registry = policy.DefaultRegistry()
	}
	if opts.Log == nil {
		l := zerolog.Nop()
		opts.Log = &l
	}
	if opts.Seed == 0 {
		opts.Seed = rand.Uint64()
	}
	if opts.DecisionSlots == 0 {
		opts.DecisionSlots = 1 << 16
	}
	s := &Server{
		log:   opts.Log,
		reg:   opts.Registry,
		seed:  opts.Seed,
		store: newStateStore(),
		dec:   newDecisions(opts.DecisionSlots, opts.Seed),

		feedbackHealth: newFeedbackHealth(),
	}
	s.m.init()
	s.pd = pd.New()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.kvHub = kv.NewHub(s.ctx, s.log)
	if err := s.Apply(cfg); err != nil {
		s.cancel()
		s.kvHub.Close()
		return nil, err
	}
	return s, nil
}

// Close stops background work owned by policies.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	closeAll(s.pols)
	s.kvHub.Close()
	s.cancel()
}

// OnApply registers a hook run (synchronously) after each accepted snapshot.
func (s *Server) OnApply(fn func(*Snapshot)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onApply = append(s.onApply, fn)
	if snap := s.snap.Load(); snap != nil {
		fn(snap)
	}
}

// Apply swaps in a new config. Surviving endpoints keep their state; on error
// the old snapshot stays.
func (s *Server) Apply(cfg *config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := cfg.Validate(); err != nil {
		s.m.reloadFailed.Add(1)
		return err
	}
	snap, pols, err := buildSnapshot(cfg, s.reg, s.snap.Load(), s.store, fleet.PolicyEnv{Log: s.log, Ctx: s.ctx, KVHub: s.kvHub}, s.seed)
	if err != nil {
		s.m.reloadFailed.Add(1)
		return err
	}
	old := s.pols
	s.snap.Store(snap)
	s.pols = pols
	closeAll(old)
	s.m.reloads.Add(1)
	s.warnFeedbackOff(snap)
	for _, fn := range s.onApply {
		fn(snap)
	}
	return nil
}

// Rejected counts a config that failed before reaching Apply (unreadable or
// invalid file), so /metrics shows every rejected reload.
func (s *Server) Rejected() { s.m.reloadFailed.Add(1) }

// Snapshot returns the live snapshot.
func (s *Server) Snapshot() *Snapshot { return s.snap.Load() }

// Complete closes a decision by id (feedback from the proxy).
func (s *Server) Complete(id uint64) bool { return s.dec.close(id) }

// Run expires stale decisions, watches completion feedback and detects
// stalled endpoints until ctx ends (see tick).
func (s *Server) Run(ctx context.Context) {
	t := time.NewTimer(stallTick(s.snap.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			snap := s.snap.Load()
			s.tick(ctx, snap, now)
			t.Reset(stallTick(snap))
		}
	}
}

// scratch is per-request working memory, pooled so decisions do not allocate.
type scratch struct {
	in     Input
	v      Verdict
	req    fleet.Request
	hasher fleet.PrefixHasher
	blocks []uint64
	picks  [16]*fleet.Endpoint
	buf    []byte
	// idx is the request body, indexed once (route/payload).
	idx payload.Index
	// body holds a streamed request body (route/body.go); drop reads the
	// part beyond max_body.
	body []byte
	drop [4096]byte

	// serve and prefill are the policies' answers for the serving (decode)
	// and the prefill pool; their Endpoints are views into picks.
	serve, prefill fleet.Choice
	// pdh is the prefill call's header source (pd.go).
	pdh pdHeaders
	// names remembers what the request header names are (headermemo.go).
	names nameMemo
}

func (s *Server) getScratch(maxBlocks int) *scratch {
	sc, _ := s.pool.Get().(*scratch)
	if sc == nil {
		sc = &scratch{buf: make([]byte, 0, 512)}
	}
	if cap(sc.blocks) < maxBlocks {
		sc.blocks = make([]uint64, 0, maxBlocks)
	}
	return sc
}

// release returns a request's scratch to the pool, after the test hook
// (observe) saw the request.
func (s *Server) release(sc *scratch) {
	if s.observe != nil {
		s.observe(&sc.req)
	}
	s.pool.Put(sc)
}

var (
	hdrFallbacksB  = []byte(HdrFallbacks)
	truncNorm      = normHeader([]byte(HdrBodyTruncated))
	origURINorm    = normHeader([]byte(HdrOriginalURI))
	origMethodNorm = normHeader([]byte(HdrOriginalMethod))
)

// Handler is the fasthttp entry point.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case PathRoute:
		s.routeHTTP(ctx)
	case PathDone:
		s.done(ctx)
	case PathHealthz:
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetBodyString("ok\n")
	case PathReadyz:
		s.ready(ctx)
	case PathMetrics:
		s.metrics(ctx)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "invalid_request_error", "not_found", "no such path; turnout serves "+PathRoute)
	}
}

// routeHTTP reads the proxy's call into an Input, decides, and writes the
// Verdict as headers (or an error answer).
func (s *Server) routeHTTP(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	if !ctx.IsPost() {
		s.m.errors[errMethod].Add(1)
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use POST "+PathRoute)
		return
	}
	snap := s.snap.Load()
	cfg := snap.Config
	sc := s.getScratch(snap.maxBlocks)
	defer s.release(sc)
	in := &sc.in
	in.Reset()
	for k, v := range ctx.Request.Header.All() {
		if len(v) == 0 {
			continue
		}
		switch kind, role := sc.names.classify(snap, k); kind {
		case kindTruncated:
			in.Truncated = true
		case kindOrigURI:
			in.URI = v
		case kindOrigMethod:
			in.Method = v
		case kindForwarded:
			in.addHeader(k, v, role)
		}
	}
	body, more, held, err := s.readBody(ctx, sc, cfg)
	defer s.budget.give(held, cfg.Limits.MaxBufferedBytes)
	if err != nil {
		return // answered
	}
	in.Truncated = in.Truncated || more
	in.Body = body
	s.decideInput(snap, in, &sc.v, sc, start)
	s.writeHTTP(ctx, &sc.v, sc)
}

// writeHTTP writes a Verdict as the HTTP answer of contract.go.
func (s *Server) writeHTTP(ctx *fasthttp.RequestCtx, v *Verdict, sc *scratch) {
	h := &ctx.Response.Header
	if !v.Routed() {
		if v.RetryAfter {
			h.Set(HdrRetryAfter, RetryAfterSeconds)
		}
		h.Set(HdrReason, v.Reason)
		ctx.SetStatusCode(v.Status)
		ctx.SetContentType("application/json")
		ctx.SetBody(v.Body)
		return
	}
	for i := range routedFields {
		f := &routedFields[i]
		if f.Header == "" {
			continue
		}
		if b := f.get(v); len(b) > 0 {
			h.SetCanonical(f.hdr, b)
		}
	}
	buf := sc.buf[:0]
	for i, f := range v.Fallbacks {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, f...)
	}
	h.SetCanonical(hdrFallbacksB, buf)
	sc.buf = buf
	if len(v.KVInsert) > 0 && v.KVAt >= 0 {
		// PD only, after a prefill round trip: allocating here is fine.
		// The edit carries kv_transfer_params: one copy in the headers.
		h.Set(HdrKVInsert, base64.StdEncoding.EncodeToString(v.KVInsert))
		h.Set(HdrKVAt, strconv.Itoa(v.KVAt))
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// pick hashes the prompt when the pool's policy wants it and runs the
// policy into c, whose Endpoints start as dst (len 0, cap = how many).
func (s *Server) pick(snap *Snapshot, p *fleet.Pool, sc *scratch, c *fleet.Choice, dst []*fleet.Endpoint) {
	r := &sc.req
	r.Blocks, r.PromptBytes = nil, 0
	*c = fleet.Choice{Endpoints: dst}
	if p.BlockBytes > 0 {
		sc.hasher.Reset(p.BlockBytes, sc.blocks)
		r.Payload.Prompt(&sc.hasher)
		r.Blocks = sc.hasher.Out
		r.PromptBytes = sc.hasher.Total
		p.Metrics.TotalBlocks.Add(uint64(len(r.Blocks)))
	}
	p.Policy.Pick(r, p, c)
	if len(c.Endpoints) == 0 {
		p.Metrics.Outcomes[fleet.OutcomeNoEndpoint].Add(1)
		return
	}
	p.Metrics.Outcomes[c.Outcome].Add(1)
	p.Metrics.MatchedBlocks.Add(uint64(c.Matched))
	s.sharePrefix(p, c.Endpoints[0], r.Blocks)
}

// appendID writes a decision id as 16 hex digits, 8 at a time (hex8): a
// loop over digits cost ~160 instructions per decision, an append per
// digit ~250.
func appendID(dst []byte, id uint64) []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hex8(uint32(id>>32)))
	binary.BigEndian.PutUint64(b[8:], hex8(uint32(id)))
	return append(dst, b[:]...)
}

// hex8 returns the 8 lower-case hex digits of v as the bytes of a word,
// the first digit in the top byte: each nibble is spread to a byte, then
// '0' is added, and 'a'-'0'-10 more where the nibble is >= 10 (n+6 carries
// into bit 4 exactly then; no byte overflows into the next).
func hex8(v uint32) uint64 {
	x := uint64(v)
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	x = (x | x<<4) & 0x0f0f0f0f0f0f0f0f
	letters := (x + 0x0606060606060606) >> 4 & 0x0101010101010101
	return x + 0x3030303030303030 + letters*('a'-'0'-10)
}

// parseID reads a decision id written by appendID.
func parseID(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b), 16, 64)
	return v, err == nil
}

func (s *Server) done(ctx *fasthttp.RequestCtx) {
	if !s.doneAllowed(ctx) {
		writeError(ctx, fasthttp.StatusForbidden, "permission_error", "forbidden",
			"completions are accepted from feedback.sources only, with "+HdrToken+" when feedback.token is set")
		return
	}
	id, ok := parseID(ctx.QueryArgs().Peek("id"))
	if !ok {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "bad_id", "id must be a decision id from "+HdrDecision)
		return
	}
	if !s.Complete(id) {
		writeError(ctx, fasthttp.StatusNotFound, "invalid_request_error", "unknown_decision", "unknown or already completed decision")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// maxEchoModel bounds the model name echoed in a 404: longer names are
// never served (Validate), and the answer must stay under MaxAnswerBody.
const maxEchoModel = 256

// cut shortens b to n bytes, marking the cut.
func cut(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(b[:n:n], "..."...)
}

// apiError is the OpenAI error envelope.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// writeError answers with an OpenAI-style JSON error. Errors are rare, so
// encoding/json's allocations are fine here.
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	b := errorBody(typ, code, msg)
	ctx.Response.Header.Set(HdrReason, code)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// OverloadedAnswer is the raw HTTP answer to a connection over
// limits.max_conns (internal/netlimit writes it): a 503 with the overloaded
// reason, so the proxy glue applies its fail mode without counting a dead
// turnout, which fasthttp's own Concurrency limit (plain text, no reason)
// would not let it do.
func OverloadedAnswer() []byte {
	body := errorBody("service_unavailable", ReasonOverloaded, "too many connections to turnout")
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n" + HdrReason + ": " + ReasonOverloaded +
		"\r\n" + HdrRetryAfter + ": " + RetryAfterSeconds + "\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
}

// ErrorHandler answers fasthttp-level errors (oversized or malformed
// requests) in JSON. fasthttp's own error text never reaches the client
// (the proxies would relay it); each answer carries an X-Turnout-Reason the
// glue knows: a request turnout could not read (431, 408) makes the proxy
// apply its fail mode rather than refuse the client.
func ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", ReasonBodyTooLarge, "request body too large")
	case errors.As(err, &small):
		writeError(ctx, StatusHeaderTooLarge, "invalid_request_error", ReasonHeaderTooLarge,
			"request headers larger than turnout's limits.max_header_bytes")
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		writeError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", ReasonReadTimeout, "the request was not received in time")
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", ReasonBadRequest, "malformed HTTP request")
	}
}

// NewHTTPServer returns a fasthttp server tuned for the route endpoint,
// bounded by the snapshot's limits (a change of those needs a new server:
// cmd/turnout reopens the listener).
func (s *Server) NewHTTPServer() *fasthttp.Server {
	return s.NewHTTPServerFor(s.snap.Load().Config)
}

// NewHTTPServerFor is NewHTTPServer with the limits of cfg, a config about
// to be applied. max_body and the body limits are read per request from the
// live snapshot; the connection-level limits (HTTPServerKey) are fixed here.
func (s *Server) NewHTTPServerFor(cfg *config.Config) *fasthttp.Server {
	lim := &cfg.Limits
	return &fasthttp.Server{
		Handler:               s.Handler,
		ErrorHandler:          ErrorHandler,
		Name:                  "turnout",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		// turnout reads bodies itself (route/body.go): only what arrived,
		// up to max_body, within the shared budget.
		StreamRequestBody: true,
		// fasthttp only pre-reads with it; readBody applies the live max_body.
		MaxRequestBodySize: hardBodyLimit(maxMaxBody),
		// The request head must fit one read buffer.
		ReadBufferSize: lim.MaxHeaderBytes,
		// limits.max_conns is internal/netlimit's (OverloadedAnswer, which the glue understands).
		ReadTimeout:  lim.ReadTimeout.D(),
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  5 * time.Minute,
		// Return per-connection buffers of idle keep-alive connections.
		ReduceMemoryUsage: true,
		Logger:            fasthttpLogger{s.log},
	}
}

// HTTPServerKey names the settings NewHTTPServerFor (and the connection limit) fix for the life of
// a server, by config field: a change of any needs a new server.
func HTTPServerKey(cfg *config.Config) map[string]string {
	l := &cfg.Limits
	return map[string]string{
		"listen":                  cfg.Listen,
		"limits.max_conns":        strconv.Itoa(l.MaxConns),
		"limits.max_header_bytes": strconv.Itoa(l.MaxHeaderBytes),
		"limits.read_timeout":     l.ReadTimeout.D().String(),
	}
}

type fasthttpLogger struct{ l *zerolog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) { f.l.Debug().Msgf(format, args...) }
