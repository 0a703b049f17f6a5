// Package tokenize turns a request's prompt into KV block keys through
// vLLM's POST /tokenize, with a bounded cache so repeated prompts cost no
// call. kv-aware uses it when a request carries text rather than token ids.
package tokenize

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
)

// ErrUnavailable wraps every failure to reach a tokenizer or read its answer.
var ErrUnavailable = errors.New("tokenizer unavailable")

// Options configure a Client.
type Options struct {
	// Timeout bounds one /tokenize call.
	Timeout time.Duration
	// CacheEntries bounds the cache of block keys (0: no cache).
	CacheEntries int
}

// Client calls /tokenize on its addresses in turn, caching block keys.
type Client struct {
	opts  Options
	addrs []string
	next  atomic.Uint64
	c     *fasthttp.Client
	hits  atomic.Uint64

	mu    sync.Mutex
	cache map[uint64][]uint64
	order []uint64 // FIFO ring for eviction
	pos   int
}

// New returns a client for the vLLM servers at addrs (host:port).
func New(opts Options, addrs []string) *Client {
	return &Client{
		opts: opts, addrs: addrs,
		c:     &fasthttp.Client{Name: "turnout-tokenize", NoDefaultUserAgentHeader: true, MaxIdleConnDuration: time.Minute},
		cache: map[uint64][]uint64{},
		order: make([]uint64, max(opts.CacheEntries, 1)),
	}
}

// Adopt takes over old's cache (a reload) when it has the same size.
func (t *Client) Adopt(old *Client) {
	if old.opts.CacheEntries != t.opts.CacheEntries {
		return
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	t.cache, t.order, t.pos = old.cache, old.order, old.pos
}

// Hits counts keys answered from the cache.
func (t *Client) Hits() uint64 { return t.hits.Load() }

// Keys returns the block keys (block size bs tokens) of a prompt: raw is the
// request's raw JSON value of field ("messages" or "prompt"), sent as it is.
func (t *Client) Keys(field string, raw, model []byte, bs int) ([]uint64, error) {
	if len(raw) == 0 {
		return nil, errors.New("no prompt")
	}
	var d xxhash.Digest
	d.ResetWithSeed(uint64(bs))
	_, _ = d.Write(model)
	_, _ = d.WriteString(field)
	_, _ = d.Write(raw)
	h := d.Sum64()
	if t.opts.CacheEntries > 0 {
		t.mu.Lock()
		keys, ok := t.cache[h]
		t.mu.Unlock()
		if ok {
			t.hits.Add(1)
			return keys, nil
		}
	}
	toks, err := t.call(field, raw, model)
	if err != nil {
		return nil, err
	}
	keys := kv.BlockKeys(toks, bs, make([]uint64, 0, len(toks)/bs+1))
	if t.opts.CacheEntries > 0 {
		t.mu.Lock()
		if old := t.order[t.pos]; old != 0 {
			delete(t.cache, old)
		}
		t.order[t.pos] = h
		t.pos = (t.pos + 1) % len(t.order)
		t.cache[h] = keys
		t.mu.Unlock()
	}
	return keys, nil
}

func (t *Client) call(field string, raw, model []byte) ([]uint32, error) {
	if len(t.addrs) == 0 {
		return nil, fmt.Errorf("%w: no tokenizer address", ErrUnavailable)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	addr := t.addrs[int(t.next.Add(1))%len(t.addrs)]
	req.SetRequestURI("http://" + addr + "/tokenize")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	body := make([]byte, 0, len(raw)+len(model)+40)
	body = append(body, `{"model":`...)
	body = payload.AppendString(body, model)
	body = append(body, `,"`...)
	body = append(body, field...)
	body = append(body, `":`...)
	body = append(body, raw...)
	body = append(body, '}')
	req.SetBody(body)
	if err := t.c.DoTimeout(req, resp, t.opts.Timeout); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, addr, err)
	}
	if resp.StatusCode() != 200 {
		return nil, fmt.Errorf("%w: %s answered %d", ErrUnavailable, addr, resp.StatusCode())
	}
	toks, ok := TokenList(payload.TopValue(resp.Body(), "tokens"), nil)
	if !ok {
		return nil, fmt.Errorf("%w: %s: no tokens in response", ErrUnavailable, addr)
	}
	return toks, nil
}

// TokenList parses a JSON array of token ids; ids outside kv.TokenID's
// range refuse the whole list (they would hash apart from KV events).
func TokenList(raw []byte, dst []uint32) ([]uint32, bool) {
	ids, ok := payload.AppendInts(nil, raw)
	if !ok {
		return dst, false
	}
	for _, v := range ids {
		t, ok := kv.TokenID(v)
		if !ok {
			return dst, false
		}
		dst = append(dst, t)
	}
	return dst, true
}
