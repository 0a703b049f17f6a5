package mock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// HTTP paths served by the mock.
const (
	PathChat             = "/v1/chat/completions"
	PathCompletions      = "/v1/completions"
	PathModels           = "/v1/models"
	PathHealth           = "/health"
	PathMetrics          = "/metrics"
	PathTokenize         = "/tokenize"
	PathResetPrefixCache = "/reset_prefix_cache"
	PathFaults           = "/mock/faults"
	PathRequests         = "/mock/requests"
	PathRequestsClear    = "/mock/requests/clear"
)

// Response headers set by the mock.
const (
	HeaderReplica    = "X-Replica"     // on every response: Config.Name
	HeaderKVTransfer = "X-KV-Transfer" // decode role only: valid|invalid|none
)

// Stats are cumulative counters for in-process users (benchmark simulator).
type Stats struct {
	Requests         int64 // completion requests received, including failed ones
	Failed           int64 // requests answered 500 by the FailRate fault
	PromptTokens     int64 // prompt tokens of admitted requests
	CachedTokens     int64 // of which served from the prefix cache (or KV transfer)
	CompletionTokens int64 // generated tokens of completed requests
	Running          int   // sequences running now
	Waiting          int   // sequences queued now
	CacheBlocks      int   // blocks cached now
	// What turnout's background work asked: GET /metrics (engine load and
	// LoRA info), GET|HEAD /health, GET /v1/models.
	Scrapes, HealthChecks, ModelPolls int64
}

// Server is one mock vLLM replica.
type Server struct {
	cfg    Config
	log    zerolog.Logger
	cache  *Cache
	sched  *Scheduler
	timing Timing
	reqlog *requestLog // nil when disabled
	srv    *fasthttp.Server

	faults atomic.Pointer[Faults]
	rngMu  sync.Mutex
	rng    *rand.Rand

	// ctx is cancelled by Close so sleeps and queue waits end promptly.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	lns       []net.Listener
	conns     map[net.Conn]struct{} // open connections, for a prompt Close
	advHost   string
	advPort   int
	closeOnce sync.Once
	closeErr  error

	seq      atomic.Uint64 // response ids
	blockSeq atomic.Uint64 // fake remote_block_ids

	requests, failed, promptTokens, cachedTokens, completionTokens atomic.Int64
	scrapes, healthChecks, modelPolls                              atomic.Int64
	// ttftNs and ttftCount are vLLM's time_to_first_token_seconds
	// histogram's sum and count: from arrival to the first token.
	ttftNs, ttftCount atomic.Int64

	modelsJSON atomic.Pointer[[]byte]
	lora       *loraState
}

// New builds a replica from cfg (zero fields get defaults, see Config). A nil
// log discards logs.
func New(cfg Config, log *zerolog.Logger) (*Server, error) {
	cfg.Models = append([]string(nil), cfg.Models...)
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("mockvllm: config: %w", err)
	}
	if log == nil {
		nop := zerolog.Nop()
		log = &nop
	}
	s := &Server{
		cfg:    cfg,
		log:    log.With().Str("component", "mockvllm").Str("replica", cfg.Name).Logger(),
		cache:  NewCache(cfg.BlockSize, cfg.CacheBlocks),
		sched:  NewScheduler(cfg.MaxRunning),
		timing: cfg.Timing(),
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		conns:  make(map[net.Conn]struct{}),
	}
	s.cache.SetSink(cfg.KVEvents)
	s.cache.SetTokenIDOffset(cfg.TokenIDOffset)
	s.faults.Store(&Faults{
		FailRate:       cfg.FailRate,
		Stall:          cfg.Stall,
		DieAfterChunks: cfg.DieAfterChunks,
		Unhealthy:      cfg.Unhealthy,
	})
	if cfg.RequestLogSize > 0 {
		s.reqlog = newRequestLog(cfg.RequestLogSize)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.lora = newLoRAState(cfg.LoRAModules, cfg.MaxLoRAs, nil)
	s.refreshModels()
	s.srv = &fasthttp.Server{
		Handler:                      s.handle,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		// Also the max header size: above turnout's limits.max_header_bytes
		// default, so e2e tests can see the proxies fail open on a head
		// turnout refuses (431) while the replica still takes it.
		ReadBufferSize:     64 << 10,
		MaxRequestBodySize: cfg.MaxRequestBodySize,
		IdleTimeout:        2 * time.Minute,
		Logger:             fasthttpLogger{&s.log},
		ConnState:          s.connState,
	}
	return s, nil
}

// fasthttpLogger routes fasthttp's own messages (e.g. the connection errors
// DieAfterChunks provokes on purpose) to debug level.
type fasthttpLogger struct{ l *zerolog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) { f.l.Debug().Msgf(format, args...) }

// Config returns the normalized configuration.
func (s *Server) Config() Config { return s.cfg }

// Cache exposes the replica's prefix cache.
func (s *Server) Cache() *Cache { return s.cache }

// Scheduler exposes the replica's running/waiting model.
func (s *Server) Scheduler() *Scheduler { return s.sched }

// Faults returns the current fault knobs.
func (s *Server) Faults() Faults { return *s.faults.Load() }

// SetFaults replaces the fault knobs; in-flight requests keep the ones they
// started with.
func (s *Server) SetFaults(f Faults) error {
	if f.FailRate < 0 || f.FailRate > 1 {
		return fmt.Errorf("mockvllm: fail rate %v outside [0,1]", f.FailRate)
	}
	if f.Stall < 0 || f.DieAfterChunks < 0 {
		return errors.New("mockvllm: negative stall or die_after_chunks")
	}
	s.faults.Store(&f)
	return nil
}

// Reseed restarts the deterministic FailRate draws.
func (s *Server) Reseed(seed uint64) {
	s.rngMu.Lock()
	s.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s.rngMu.Unlock()
}

func (s *Server) draw() float64 {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64()
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Requests:         s.requests.Load(),
		Failed:           s.failed.Load(),
		PromptTokens:     s.promptTokens.Load(),
		CachedTokens:     s.cachedTokens.Load(),
		CompletionTokens: s.completionTokens.Load(),
		Running:          s.sched.Running(),
		Waiting:          s.sched.Waiting(),
		CacheBlocks:      s.cache.Len(),
		Scrapes:          s.scrapes.Load(),
		HealthChecks:     s.healthChecks.Load(),
		ModelPolls:       s.modelPolls.Load(),
	}
}

// Serve answers requests on ln until Close. The first listener's address is
// what a prefill replica advertises as remote_host/remote_port.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.track(ln); err != nil {
		return err
	}
	if err := s.srv.Serve(ln); err != nil {
		if s.ctx.Err() != nil {
			return nil // listener closed by Close
		}
		return fmt.Errorf("mockvllm %s: serve: %w", s.cfg.Name, err)
	}
	return nil
}

// ListenAndServe listens on TCP addr and serves until Close.
func (s *Server) ListenAndServe(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mockvllm %s: listen: %w", s.cfg.Name, err)
	}
	return s.Serve(ln)
}

// Start listens on addr (e.g. "127.0.0.1:0"), serves in the background and
// returns the base URL ("http://host:port"). Handy for tests.
func (s *Server) Start(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("mockvllm %s: listen: %w", s.cfg.Name, err)
	}
	if err := s.track(ln); err != nil {
		return "", err
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && s.ctx.Err() == nil {
			s.log.Error().Err(err).Msg("serve")
		}
	}()
	return "http://" + ln.Addr().String(), nil
}

func (s *Server) track(ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		_ = ln.Close()
		return fmt.Errorf("mockvllm %s: %w", s.cfg.Name, net.ErrClosed)
	}
	s.lns = append(s.lns, ln)
	if len(s.lns) == 1 {
		s.advHost, s.advPort = s.cfg.AdvertiseHost, s.cfg.AdvertisePort
		host, port, err := net.SplitHostPort(ln.Addr().String())
		if err == nil {
			if s.advHost == "" {
				s.advHost = host
				if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
					s.advHost = "127.0.0.1"
				}
			}
			if s.advPort == 0 {
				s.advPort, _ = strconv.Atoi(port)
			}
		}
	}
	return nil
}

// Addr returns the first listener's address, or nil before Serve/Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lns) == 0 {
		return nil
	}
	return s.lns[0].Addr()
}

func (s *Server) advertised() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.advHost == "" {
		return s.cfg.AdvertiseHost, s.cfg.AdvertisePort
	}
	return s.advHost, s.advPort
}

// Close stops listening, aborts in-flight sleeps and streams, closes every
// connection and waits (up to 5 s) for them to finish. Safe to call more than
// once. fasthttp's own Shutdown is not used: it polls every 100 ms, which
// would add 100 ms to every test that closes a replica.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.cancel()
		for _, ln := range s.lns {
			if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) && s.closeErr == nil {
				s.closeErr = fmt.Errorf("mockvllm %s: close listener: %w", s.cfg.Name, err)
			}
		}
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.mu.Lock()
			n := len(s.conns)
			s.mu.Unlock()
			if n == 0 {
				return
			}
			if time.Now().After(deadline) {
				s.closeErr = fmt.Errorf("mockvllm %s: %d connections still open after 5s", s.cfg.Name, n)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	return s.closeErr
}

// connState tracks connections so Close can cut them, including one
// accepted concurrently with Close.
func (s *Server) connState(c net.Conn, st fasthttp.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case fasthttp.StateNew:
		s.conns[c] = struct{}{}
		if s.ctx.Err() != nil {
			_ = c.Close()
		}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(s.conns, c)
	}
}

// sleep waits d, returning false if the server is closing.
func (s *Server) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	// Keep header names byte-exact ("X-KV-Transfer", not "X-Kv-Transfer")
	// for anything that greps raw responses.
	ctx.Response.Header.DisableNormalizing()
	ctx.Response.Header.Set(HeaderReplica, s.cfg.Name)
	switch string(ctx.Path()) {
	// Control/observation endpoints are not logged: health checks and
	// scrapes would flush the request ring.
	case PathHealth:
		s.healthChecks.Add(1)
		if s.allow(ctx, fasthttp.MethodGet, fasthttp.MethodHead) {
			if s.faults.Load().Unhealthy {
				ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			}
		}
		return
	case PathMetrics:
		s.scrapes.Add(1)
		if s.allow(ctx, fasthttp.MethodGet, "") {
			ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
			ctx.Response.SetBodyRaw(s.appendMetrics(make([]byte, 0, 2048)))
		}
		return
	case PathFaults:
		s.handleFaults(ctx)
		return
	case PathRequests:
		if s.allow(ctx, fasthttp.MethodGet, "") {
			ctx.SetContentType("application/json")
			ctx.Response.SetBodyRaw(s.reqlog.appendJSON(make([]byte, 0, 4096)))
		}
		return
	case PathRequestsClear:
		if s.allow(ctx, fasthttp.MethodPost, "") {
			s.reqlog.clear()
		}
		return
	}

	s.reqlog.add(ctx)
	switch string(ctx.Path()) {
	case PathChat:
		if s.allow(ctx, fasthttp.MethodPost, "") {
			s.handleGenerate(ctx, apiChat)
		}
	case PathCompletions:
		if s.allow(ctx, fasthttp.MethodPost, "") {
			s.handleGenerate(ctx, apiCompletions)
		}
	case PathModels:
		s.modelPolls.Add(1)
		if s.allow(ctx, fasthttp.MethodGet, "") {
			ctx.SetContentType("application/json")
			ctx.SetBody(*s.modelsJSON.Load())
		}
	case PathLoadLoRA, PathUnloadLoRA:
		if !s.cfg.EnableLoRA {
			s.writeError(ctx, fasthttp.StatusNotFound, "Not Found: "+string(ctx.Path()), "NotFoundError")
		} else if s.allow(ctx, fasthttp.MethodPost, "") {
			s.handleLoad(ctx, string(ctx.Path()) == PathLoadLoRA)
		}
	case PathTokenize:
		if s.allow(ctx, fasthttp.MethodPost, "") {
			s.handleTokenize(ctx)
		}
	case PathResetPrefixCache:
		if s.allow(ctx, fasthttp.MethodPost, "") {
			s.cache.Reset()
		}
	default:
		s.writeError(ctx, fasthttp.StatusNotFound, "Not Found: "+string(ctx.Path()), "NotFoundError")
	}
}

// allow answers 405 unless the method is m1 or m2.
func (s *Server) allow(ctx *fasthttp.RequestCtx, m1, m2 string) bool {
	m := string(ctx.Method())
	if m == m1 || (m2 != "" && m == m2) {
		return true
	}
	s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed", "MethodNotAllowedError")
	return false
}

func (s *Server) writeError(ctx *fasthttp.RequestCtx, status int, msg, typ string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(appendErrorJSON(make([]byte, 0, 128+len(msg)), msg, typ, status))
}

// refreshModels rebuilds the /v1/models answer (adapters loaded or unloaded).
func (s *Server) refreshModels() {
	b := s.buildModelsJSON()
	s.modelsJSON.Store(&b)
}

// buildModelsJSON lists the base models, then the adapters as vLLM does:
// root is the adapter's path, parent the first served model name.
func (s *Server) buildModelsJSON() []byte {
	created := time.Now().Unix()
	b := []byte(`{"object":"list","data":[`)
	entry := func(id, root, parent string) {
		if b[len(b)-1] != '[' {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, id)
		b = append(b, `,"object":"model","created":`...)
		b = appendInt(b, created)
		b = append(b, `,"owned_by":"vllm","root":`...)
		b = appendJSONString(b, root)
		b = append(b, `,"parent":`...)
		if parent == "" {
			b = append(b, "null"...)
		} else {
			b = appendJSONString(b, parent)
		}
		b = append(b, `,"max_model_len":`...)
		b = appendInt(b, int64(s.cfg.MaxModelLen))
		b = append(b, '}')
	}
	for _, m := range s.cfg.Models {
		entry(m, m, "")
	}
	for _, a := range s.lora.list() {
		entry(a.Name, a.Path, s.cfg.Models[0])
	}
	return append(b, "]}"...)
}

func (s *Server) hasModel(m string) bool {
	for _, x := range s.cfg.Models {
		if x == m {
			return true
		}
	}
	return s.lora.has(m)
}

// handleTokenize mirrors vLLM's /tokenize using the cache's own tokenizer and
// chat template, so tests can predict block hashes from it.
func (s *Server) handleTokenize(ctx *fasthttp.RequestCtx) {
	req, err := parseRequest(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "BadRequestError")
		return
	}
	var toks []int32
	if req.Messages != nil {
		toks, err = req.chatTokens()
	} else {
		var ps [][]int32
		ps, err = req.completionTokens()
		if err == nil && len(ps) != 1 {
			err = fmt.Errorf("tokenize takes a single prompt: %w", ErrBadPrompt)
		}
		if err == nil {
			toks = ps[0]
		}
	}
	if err != nil {
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "BadRequestError")
		return
	}
	b := make([]byte, 0, 64+len(toks)*11)
	b = append(b, `{"count":`...)
	b = appendInt(b, int64(len(toks)))
	b = append(b, `,"max_model_len":`...)
	b = appendInt(b, int64(s.cfg.MaxModelLen))
	b = append(b, `,"tokens":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInt(b, int64(uint32(t)+s.cfg.TokenIDOffset))
	}
	b = append(b, `],"token_strs":null}`...)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(b)
}

// faultsWire is the /mock/faults JSON; on POST every field is optional and
// only the ones present change.
type faultsWire struct {
	FailRate       *float64 `json:"fail_rate,omitempty"`
	StallMs        *float64 `json:"stall_ms,omitempty"`
	Stall          *string  `json:"stall,omitempty"` // Go duration, e.g. "250ms"
	DieAfterChunks *int     `json:"die_after_chunks,omitempty"`
	Unhealthy      *bool    `json:"unhealthy,omitempty"`
	ShuttingDown   *bool    `json:"shutting_down,omitempty"`
	Seed           *uint64  `json:"seed,omitempty"` // restarts the FailRate draws
}

func (s *Server) handleFaults(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Method()) {
	case fasthttp.MethodGet:
	case fasthttp.MethodPost:
		var w faultsWire
		if err := jsonAPI.Unmarshal(ctx.PostBody(), &w); err != nil {
			s.writeError(ctx, fasthttp.StatusBadRequest, "invalid JSON body: "+err.Error(), "BadRequestError")
			return
		}
		f := s.Faults()
		if w.FailRate != nil {
			f.FailRate = *w.FailRate
		}
		if w.StallMs != nil {
			f.Stall = time.Duration(*w.StallMs * float64(time.Millisecond))
		}
		if w.Stall != nil {
			d, err := time.ParseDuration(*w.Stall)
			if err != nil {
				s.writeError(ctx, fasthttp.StatusBadRequest, "stall: "+err.Error(), "BadRequestError")
				return
			}
			f.Stall = d
		}
		if w.DieAfterChunks != nil {
			f.DieAfterChunks = *w.DieAfterChunks
		}
		if w.Unhealthy != nil {
			f.Unhealthy = *w.Unhealthy
		}
		if w.ShuttingDown != nil {
			f.ShuttingDown = *w.ShuttingDown
		}
		if err := s.SetFaults(f); err != nil {
			s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "BadRequestError")
			return
		}
		if w.Seed != nil {
			s.Reseed(*w.Seed)
		}
		s.log.Info().Float64("fail_rate", f.FailRate).Dur("stall", f.Stall).
			Int("die_after_chunks", f.DieAfterChunks).Bool("unhealthy", f.Unhealthy).Msg("faults changed")
	default:
		s.allow(ctx, fasthttp.MethodGet, fasthttp.MethodPost)
		return
	}
	f := s.Faults()
	b := []byte(`{"fail_rate":`)
	b = appendFloat(b, f.FailRate)
	b = append(b, `,"stall_ms":`...)
	b = appendFloat(b, float64(f.Stall)/float64(time.Millisecond))
	b = append(b, `,"die_after_chunks":`...)
	b = appendInt(b, int64(f.DieAfterChunks))
	b = append(b, `,"unhealthy":`...)
	b = strconv.AppendBool(b, f.Unhealthy)
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(b)
}
