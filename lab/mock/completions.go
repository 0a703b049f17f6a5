package mock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

type apiKind uint8

const (
	apiChat apiKind = iota
	apiCompletions
)

// kvFlags is parsed first and alone so a malformed detail field elsewhere in
// kv_transfer_params still lets us see which handshake was intended.
type kvFlags struct {
	DoRemoteDecode  bool `json:"do_remote_decode"`
	DoRemotePrefill bool `json:"do_remote_prefill"`
}

type kvParams struct {
	RemoteEngineID string          `json:"remote_engine_id"`
	RemoteHost     string          `json:"remote_host"`
	RemotePort     int             `json:"remote_port"`
	RemoteBlockIDs json.RawMessage `json:"remote_block_ids"`
}

// KV transfer outcomes reported in X-KV-Transfer by a decode replica.
const (
	KVTransferValid   = "valid"
	KVTransferInvalid = "invalid"
	KVTransferNone    = "none"
)

func parseKVFlags(raw []byte) kvFlags {
	var f kvFlags
	if len(raw) == 0 {
		return f
	}
	_ = jsonAPI.Unmarshal(raw, &f) // unparsable params count as absent
	return f
}

// checkTransfer validates NIXL-style params against the prompt's block count
// (partial last blocks included, as the prefill side sends them too).
func checkTransfer(raw []byte, wantBlocks int) string {
	if !parseKVFlags(raw).DoRemotePrefill {
		return KVTransferNone
	}
	var p kvParams
	if err := jsonAPI.Unmarshal(raw, &p); err != nil {
		return KVTransferInvalid
	}
	if p.RemoteEngineID == "" || p.RemoteHost == "" || p.RemotePort <= 0 {
		return KVTransferInvalid
	}
	ids := skipSpace(p.RemoteBlockIDs)
	if len(ids) == 0 || ids[0] != '[' {
		return KVTransferInvalid
	}
	var list []int64
	if err := jsonAPI.Unmarshal(ids, &list); err != nil || len(list) != wantBlocks {
		return KVTransferInvalid
	}
	return KVTransferValid
}

// generation is one admitted completion request. For streaming it is also
// the response body: fasthttp calls WriteTo on the connection's goroutine
// after the handler returns, so it must own everything it references.
type generation struct {
	s            *Server
	arrived      time.Time // when the request came in (TTFT counts the queue)
	api          apiKind
	model        string
	id           string
	created      int64
	prompts      [][]int32
	promptTokens int
	promptBlocks int // ceil(len/BlockSize) summed over prompts
	nOut         int
	transferred  bool // decode role with valid kv_transfer_params
	remotePD     bool // prefill role answering do_remote_decode
	includeUsage bool
	dieAfter     int

	// lora is the request's adapter ("" = a base model).
	lora   string
	cached int            // set by admit
	pr     *io.PipeReader // only if fasthttp falls back to Read
	pooled *[]int32       // chat token buffer to recycle when done
}

// Pools keep the per-request garbage low at benchmark rates.
var (
	tokenPool = sync.Pool{New: func() any { b := make([]int32, 0, 1024); return &b }}
	ssePool   = sync.Pool{New: func() any { b := make([]byte, 0, 8192); return &b }}
)

// release recycles pooled buffers; g must not be used afterwards.
func (g *generation) release() {
	if g.pooled != nil {
		if t := g.prompts[0]; cap(t) <= 64<<10 { // don't pin huge prompts
			*g.pooled = t[:0]
			tokenPool.Put(g.pooled)
		}
		g.pooled = nil
		g.prompts = nil
	}
}

var errDied = errors.New("mockvllm: die_after_chunks fault")
var errClosing = errors.New("mockvllm: server closing")

func (s *Server) handleGenerate(ctx *fasthttp.RequestCtx, api apiKind) {
	s.requests.Add(1)
	req, err := parseRequest(ctx.PostBody())
	if err != nil {
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "BadRequestError")
		return
	}
	var prompts [][]int32
	var pooled *[]int32
	if api == apiChat {
		pooled = tokenPool.Get().(*[]int32)
		var t []int32
		t, err = req.appendChatTokens((*pooled)[:0])
		prompts = [][]int32{t}
	} else {
		prompts, err = req.completionTokens()
	}
	if err != nil {
		if pooled != nil {
			tokenPool.Put(pooled)
		}
		s.writeError(ctx, fasthttp.StatusBadRequest, err.Error(), "BadRequestError")
		return
	}
	g := &generation{s: s, api: api, prompts: prompts, pooled: pooled, arrived: time.Now()}
	s.generate(ctx, g, req)
}

// generate runs a parsed request; it owns g and releases it unless the
// response body stream took it over.
func (s *Server) generate(ctx *fasthttp.RequestCtx, g *generation, req *apiRequest) {
	streamed := false
	defer func() {
		if !streamed {
			g.release()
		}
	}()
	model := req.Model
	switch {
	case model == "":
		model = s.cfg.Models[0]
	case s.cfg.StrictModels && !s.hasModel(model):
		s.writeError(ctx, fasthttp.StatusNotFound, "The model `"+model+"` does not exist.", "NotFoundError")
		return
	default:
		// The decoded string aliases the request buffer, which fasthttp
		// reuses before a stream finishes.
		model = strings.Clone(model)
	}
	nOut := s.cfg.MaxTokensDefault
	if req.MaxCompletionTokens != nil {
		nOut = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil {
		nOut = *req.MaxTokens
	}
	if nOut < 1 {
		s.writeError(ctx, fasthttp.StatusBadRequest, "max_tokens must be at least 1", "BadRequestError")
		return
	}

	f := s.faults.Load()
	if f.ShuttingDown {
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "server shutting down", "ServiceUnavailableError")
		return
	}
	if f.Stall > 0 && (f.StallSpare == "" || !bytes.Contains(ctx.PostBody(), []byte(f.StallSpare))) && !s.sleep(f.Stall) {
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "server shutting down", "ServiceUnavailableError")
		return
	}
	if f.FailRate > 0 && s.draw() < f.FailRate {
		s.failed.Add(1)
		s.writeError(ctx, fasthttp.StatusInternalServerError, "mock injected failure", "InternalServerError")
		return
	}

	g.model = model
	g.created = time.Now().Unix()
	g.nOut = nOut
	g.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	g.dieAfter = f.DieAfterChunks
	bs := s.cfg.BlockSize
	for _, p := range g.prompts {
		g.promptTokens += len(p)
		g.promptBlocks += (len(p) + bs - 1) / bs
	}
	switch s.cfg.Role {
	case RolePrefill:
		if parseKVFlags(req.KVTransferParams).DoRemoteDecode {
			// vLLM's P/D proxy expects a one-token, non-streamed answer
			// carrying the handles of the computed KV blocks.
			g.remotePD = true
			g.nOut = 1
		}
	case RoleDecode:
		st := checkTransfer(req.KVTransferParams, g.promptBlocks)
		ctx.Response.Header.Set(HeaderKVTransfer, st)
		g.transferred = st == KVTransferValid
	}
	g.id = g.makeID(ctx)
	if s.cfg.EnableLoRA && s.lora.has(model) {
		g.lora = model
	}

	s.log.Debug().Str("path", string(ctx.Path())).Int("prompt_tokens", g.promptTokens).
		Int("max_tokens", g.nOut).Bool("stream", req.Stream).Msg("generate")

	if req.Stream && !g.remotePD {
		ctx.SetContentType("text/event-stream; charset=utf-8")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		// Real vLLM sends headers before the first token; only worth a
		// separate write when there is a delay to expose.
		ctx.Response.ImmediateHeaderFlush = s.timing.TimeScale > 0
		ctx.Response.SetBodyStream(g, -1)
		streamed = true // released by g.Close
		return
	}

	g.arrive()
	if err := s.sched.Acquire(s.ctx); err != nil {
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "server shutting down", "ServiceUnavailableError")
		return
	}
	load := g.admit()
	s.firstToken(time.Since(g.arrived) + load + s.timing.TTFT(g.uncached()))
	ok := s.sleep(load + s.timing.Total(g.uncached(), g.nOut))
	s.sched.Release()
	g.finish()
	if !ok {
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "server shutting down", "ServiceUnavailableError")
		return
	}
	s.completionTokens.Add(int64(g.nOut * len(g.prompts)))
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(g.appendResponse(make([]byte, 0, 512)))
}

// makeID follows vLLM: the caller's X-Request-Id becomes the response id.
func (g *generation) makeID(ctx *fasthttp.RequestCtx) string {
	prefix := "chatcmpl-"
	if g.api == apiCompletions {
		prefix = "cmpl-"
	}
	if rid := ctx.Request.Header.Peek("X-Request-Id"); len(rid) > 0 {
		return prefix + string(rid)
	}
	b := append([]byte(prefix), g.s.cfg.Name...)
	b = append(b, '-')
	b = appendInt(b, int64(g.s.seq.Add(1)))
	return string(b)
}

// admit runs the prefix cache for an admitted request. Looking up at
// admission (not arrival) matches vLLM, whose scheduler checks the cache when
// it schedules a waiting request, so a queued request can hit blocks stored
// by the ones that ran before it.
// firstToken counts one request's time to first token (the metrics'
// histogram sum and count).
func (s *Server) firstToken(d time.Duration) {
	s.ttftNs.Add(int64(d))
	s.ttftCount.Add(1)
}

// arrive counts the request's adapter as waiting (vllm:lora_requests_info).
func (g *generation) arrive() {
	if g.lora != "" {
		g.s.lora.arrive(g.lora)
	}
}

// finish ends the adapter's running request.
func (g *generation) finish() {
	if g.lora != "" {
		g.s.lora.done(g.lora)
	}
}

// admit serves the prompt from the prefix cache and returns how long the
// request's adapter takes to load (0: hot or none).
func (g *generation) admit() time.Duration {
	s := g.s
	var load time.Duration
	if g.lora != "" && s.lora.admit(g.lora) {
		load = s.timing.Scale(s.cfg.LoRALoadCost)
	}
	bs, key := s.cfg.BlockSize, AdapterKey(g.lora)
	for _, p := range g.prompts {
		if g.transferred {
			// Remote-prefilled blocks land in the local cache as computed.
			s.cache.ServeKeyed(key, p)
			g.cached += min(len(p)/bs, s.cache.Capacity()) * bs
		} else {
			g.cached += s.cache.ServeKeyed(key, p)
		}
	}
	s.promptTokens.Add(int64(g.promptTokens))
	s.cachedTokens.Add(int64(g.cached))
	return load
}

func (g *generation) uncached() int {
	if g.transferred {
		return 0 // TTFT is the overhead only: the KV arrived prefilled
	}
	return g.promptTokens - g.cached
}

func (g *generation) appendUsage(b []byte) []byte {
	completion := g.nOut * len(g.prompts)
	b = append(b, `{"prompt_tokens":`...)
	b = appendInt(b, int64(g.promptTokens))
	b = append(b, `,"total_tokens":`...)
	b = appendInt(b, int64(g.promptTokens+completion))
	b = append(b, `,"completion_tokens":`...)
	b = appendInt(b, int64(completion))
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = appendInt(b, int64(g.cached))
	return append(b, "}}"...)
}

func (g *generation) appendHeader(b []byte, object string) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, g.id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = appendInt(b, g.created)
	b = append(b, `,"model":`...)
	return appendJSONString(b, g.model)
}

// appendResponse renders the non-streaming OpenAI response.
func (g *generation) appendResponse(b []byte) []byte {
	if g.api == apiChat {
		b = g.appendHeader(b, "chat.completion")
		b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
		b = appendGeneratedText(b, g.nOut)
		b = append(b, `"},"logprobs":null,"finish_reason":"length","stop_reason":null}]`...)
	} else {
		b = g.appendHeader(b, "text_completion")
		b = append(b, `,"choices":[`...)
		for i := range g.prompts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"index":`...)
			b = appendInt(b, int64(i))
			b = append(b, `,"text":"`...)
			b = appendGeneratedText(b, g.nOut)
			b = append(b, `","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}`...)
		}
		b = append(b, ']')
	}
	b = append(b, `,"usage":`...)
	b = g.appendUsage(b)
	if g.remotePD {
		b = g.appendKVTransferParams(b)
	}
	return append(b, '}')
}

// appendKVTransferParams is what a vLLM prefill instance returns for the
// decode instance to pull the KV cache from.
func (g *generation) appendKVTransferParams(b []byte) []byte {
	host, port := g.s.advertised()
	b = append(b, `,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":`...)
	b = appendJSONString(b, g.s.cfg.EngineID)
	b = append(b, `,"remote_block_ids":[`...)
	n := g.promptBlocks
	base := g.s.blockSeq.Add(uint64(n)) - uint64(n)
	capacity := uint64(g.s.cache.Capacity())
	for i := 0; i < n; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInt(b, int64((base+uint64(i))%capacity))
	}
	b = append(b, `],"remote_host":`...)
	b = appendJSONString(b, host)
	b = append(b, `,"remote_port":`...)
	b = appendInt(b, int64(port))
	return append(b, `,"tp_size":1}`...)
}

// SupportsBodyWriteTo lets fasthttp call WriteTo on the chunked writer, so
// every Write becomes one flushed HTTP chunk and an error return drops the
// connection without the terminating chunk (needed for DieAfterChunks).
func (g *generation) SupportsBodyWriteTo() bool { return true }

// Read is a fallback for fasthttp paths that do not use WriteTo.
func (g *generation) Read(p []byte) (int, error) {
	if g.pr == nil {
		pr, pw := io.Pipe()
		g.pr = pr
		go func() {
			_, err := g.WriteTo(pw)
			_ = pw.CloseWithError(err)
		}()
	}
	n, err := g.pr.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, fmt.Errorf("mockvllm stream: %w", err)
	}
	return n, err
}

// Close is called by fasthttp once the body is done (or dropped unsent).
func (g *generation) Close() error {
	if g.pr != nil {
		// The pipe goroutine may still be running WriteTo: leave the
		// buffers to the GC.
		_ = g.pr.Close()
		return nil
	}
	g.release()
	return nil
}

// sseWriter batches SSE events that are due at the same instant and flushes
// before every sleep, so timing is real-time while a zero-latency run costs
// one write per response instead of one per token.
type sseWriter struct {
	w        io.Writer
	buf      []byte
	n        int64
	events   int
	dieAfter int
}

func (sw *sseWriter) flush() error {
	if len(sw.buf) == 0 {
		return nil
	}
	m, err := sw.w.Write(sw.buf)
	sw.n += int64(m)
	sw.buf = sw.buf[:0]
	if err != nil {
		return fmt.Errorf("mockvllm stream write: %w", err)
	}
	return nil
}

// begin opens an event; it fails once dieAfter events were sent, after
// flushing them, which is how the stream dies mid-way.
func (sw *sseWriter) begin() error {
	if sw.dieAfter > 0 && sw.events >= sw.dieAfter {
		if err := sw.flush(); err != nil {
			return err
		}
		return errDied
	}
	sw.events++
	sw.buf = append(sw.buf, "data: "...)
	return nil
}

func (sw *sseWriter) end() { sw.buf = append(sw.buf, "\n\n"...) }

// WriteTo runs the request (queue, prefill, decode) while streaming SSE.
func (g *generation) WriteTo(w io.Writer) (int64, error) {
	s := g.s
	g.arrive()
	if err := s.sched.Acquire(s.ctx); err != nil {
		return 0, errClosing
	}
	defer s.sched.Release()
	start := time.Now()
	load := g.admit()
	defer g.finish()
	ttft := load + s.timing.TTFT(g.uncached())
	itl := s.timing.ITL()

	bufp := ssePool.Get().(*[]byte)
	sw := &sseWriter{w: w, buf: (*bufp)[:0], dieAfter: g.dieAfter}
	object := "chat.completion.chunk"
	if g.api == apiCompletions {
		object = "text_completion"
	}
	prefix := g.appendHeader(make([]byte, 0, 128), object)
	prefix = append(prefix, `,"choices":[`...)
	defer func() {
		if cap(sw.buf) <= 64<<10 { // don't pin huge buffers
			*bufp = sw.buf[:0]
			ssePool.Put(bufp)
		}
	}()

	for i := 0; i < g.nOut; i++ {
		// Deadlines from a fixed start keep per-token jitter from adding up.
		if d := time.Until(start.Add(ttft + time.Duration(i)*itl)); d > 0 {
			if err := sw.flush(); err != nil {
				return sw.n, err
			}
			if !s.sleep(d) {
				return sw.n, errClosing
			}
		}
		if i == 0 {
			s.firstToken(time.Since(g.arrived))
		}
		if i == 0 && g.api == apiChat {
			if err := sw.begin(); err != nil {
				return sw.n, err
			}
			sw.buf = append(sw.buf, prefix...)
			sw.buf = append(sw.buf, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`...)
			sw.end()
		}
		finish := "null"
		if i == g.nOut-1 {
			finish = `"length"`
		}
		for p := range g.prompts {
			if err := sw.begin(); err != nil {
				return sw.n, err
			}
			sw.buf = append(sw.buf, prefix...)
			sw.buf = append(sw.buf, `{"index":`...)
			sw.buf = appendInt(sw.buf, int64(p))
			if g.api == apiChat {
				sw.buf = append(sw.buf, `,"delta":{"content":"`...)
			} else {
				sw.buf = append(sw.buf, `,"text":"`...)
			}
			if i > 0 {
				sw.buf = append(sw.buf, ' ')
			}
			sw.buf = appendTokenWord(sw.buf, i+1)
			if g.api == apiChat {
				sw.buf = append(sw.buf, `"},"logprobs":null,"finish_reason":`...)
			} else {
				sw.buf = append(sw.buf, `","logprobs":null,"finish_reason":`...)
			}
			sw.buf = append(sw.buf, finish...)
			sw.buf = append(sw.buf, `,"stop_reason":null}]}`...)
			sw.end()
		}
	}
	s.completionTokens.Add(int64(g.nOut * len(g.prompts)))
	if g.includeUsage {
		if err := sw.begin(); err != nil {
			return sw.n, err
		}
		sw.buf = g.appendHeader(sw.buf, object)
		sw.buf = append(sw.buf, `,"choices":[],"usage":`...)
		sw.buf = g.appendUsage(sw.buf)
		sw.buf = append(sw.buf, '}')
		sw.end()
	}
	if err := sw.begin(); err != nil {
		return sw.n, err
	}
	sw.buf = append(sw.buf, "[DONE]"...)
	sw.end()
	return sw.n, sw.flush()
}
