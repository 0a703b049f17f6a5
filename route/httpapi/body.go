package httpapi

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// Request bodies are read by turnout itself (fasthttp StreamRequestBody),
// not by fasthttp: fasthttp reserves the whole announced Content-Length up
// front, so 300 connections announcing 2 MiB and sending 1 B/s held 600 MB.
// Here a body grows with the bytes that arrived, only up to max_body (the
// part routing reads), each chunk must come within limits.body_idle_timeout,
// and the buffers of all in-flight requests share limits.max_buffered_bytes.

// hardBodyLimit is the largest body accepted at all; the part beyond
// max_body is read and dropped (the proxy sent it, routing ignores it).
func hardBodyLimit(maxBody int) int { return 4*maxBody + 1<<20 }

// maxMaxBody is the largest max_body Validate accepts.
const maxMaxBody = 64 << 20

// bodyBudget counts buffer bytes held by in-flight requests.
type bodyBudget struct {
	used atomic.Int64
	// peak is the most held since memory was last returned to the OS.
	peak atomic.Int64
	// freedAt (unix ns) rate-limits returning memory to the OS.
	freedAt atomic.Int64
	// later: a deferred return is armed (give).
	later atomic.Bool
	// grown is the body buffer bytes allocated since memory was last
	// returned: pooled buffers (charged only while their request runs)
	// outlive a burst whose bodies never held much of the budget at once.
	grown atomic.Int64
}

// grow notes n bytes of new body buffer.
func (b *bodyBudget) grow(n int) { b.grown.Add(int64(n)) }

// spike reports whether memory is worth returning: a peak above a quarter
// of the limit, or an eighth of it allocated as new (pooled) buffers.
func (b *bodyBudget) spike(limit int) bool {
	return b.peak.Load() >= int64(limit/4) || b.grown.Load() >= int64(limit/8)
}

func (b *bodyBudget) take(n, limit int) bool {
	v := b.used.Add(int64(n))
	if v > int64(limit) {
		b.used.Add(-int64(n))
		return false
	}
	if v > b.peak.Load() {
		b.peak.Store(v)
	}
	return true
}

// give returns n bytes. When the last in-flight body is done after a spike
// (a peak above a quarter of the limit), the memory goes back to the OS at
// once: the Go scavenger would otherwise keep it for minutes, and the next
// spike is as likely to come from another tenant of the machine.
//
// A spike's end that falls within the rate limit is not forgotten: the
// return is deferred to the limit's end, and done again once the burst's
// connections are gone (fasthttp stops idle workers after 10 s; their
// stacks and buffers are garbage only then). Without that, the memory of
// the burst's last seconds stays for minutes (2.4-2.7x idle).
func (b *bodyBudget) give(n, limit int) {
	if b.used.Add(-int64(n)) != 0 || !b.spike(limit) {
		return
	}
	now := time.Now().UnixNano()
	last := b.freedAt.Load()
	if now-last < int64(freeEvery) || !b.freedAt.CompareAndSwap(last, now) {
		b.freeLater(time.Duration(int64(freeEvery) - (now - last)))
		return
	}
	b.peak.Store(0)
	b.grown.Store(0)
	go debug.FreeOSMemory()
	b.freeLater(freeAfterConns)
}

// freeEvery rate-limits returning memory to the OS (a full GC each time);
// freeAfterConns is when a burst's idle connection workers are gone.
const (
	freeEvery      = 5 * time.Second
	freeAfterConns = 15 * time.Second
)

// freeLater returns memory to the OS after d, unless a body is in flight
// then; one deferred return is armed at a time.
func (b *bodyBudget) freeLater(d time.Duration) {
	if !b.later.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(d, func() {
		b.later.Store(false)
		if b.used.Load() == 0 {
			b.freedAt.Store(time.Now().UnixNano())
			b.peak.Store(0)
			b.grown.Store(0)
			// Twice: a pooled buffer is released at the second collection
			// (sync.Pool's victim cache), the first moves it there.
			debug.FreeOSMemory()
			debug.FreeOSMemory()
		}
	})
}

// errBodyAnswered means readBody already wrote the answer.
var errBodyAnswered = errors.New("request body refused")

// readBody returns the first max_body bytes of the request body and whether
// more followed. held is the budget to give back when the request is done.
// Without a body stream (a fasthttp server that read the body itself, unit
// tests) the body is used as it is.
func (a *API) readBody(ctx *fasthttp.RequestCtx, t *route.Txn, cfg *config.Config) (body []byte, more bool, held int, err error) {
	stream := ctx.RequestBodyStream()
	if stream == nil {
		body = ctx.PostBody()
		if len(body) > cfg.MaxBody {
			return body[:cfg.MaxBody], true, 0, nil
		}
		return body, false, 0, nil
	}
	lim := &cfg.Limits
	hard := hardBodyLimit(cfg.MaxBody)
	cl := ctx.Request.Header.ContentLength()
	if cl > hard {
		ctx.SetConnectionClose()
		a.refuse(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", contract.ReasonBodyTooLarge, "request body too large")
		return nil, false, 0, errBodyAnswered
	}
	want := cfg.MaxBody
	if cl >= 0 {
		want = min(want, cl)
	}
	conn := ctx.Conn()
	deadline := ctx.Time().Add(lim.ReadTimeout.D())
	fail := func(err error) ([]byte, bool, int, error) {
		ctx.SetConnectionClose()
		var ne net.Error
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
			a.refuse(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", contract.ReasonReadTimeout, "the request body stalled")
		case errors.Is(err, errOverBudget):
			ctx.Response.Header.Set(contract.HdrRetryAfter, contract.RetryAfterSeconds)
			a.refuse(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable", contract.ReasonOverloaded, "too many request bytes in flight")
		default:
			a.refuse(ctx, fasthttp.StatusBadRequest, "invalid_request_error", contract.ReasonBadRequest, "unreadable request body")
		}
		return nil, false, held, errBodyAnswered
	}
	buf := t.Buf.Body[:0]
	for len(buf) < want {
		if len(buf) == cap(buf) {
			// Grow with the bytes that arrived, never to the announced length at once.
			n := min(max(2*cap(buf), 16<<10), want)
			if !a.budget.take(n-held, lim.MaxBufferedBytes) {
				return fail(errOverBudget)
			}
			held = n
			a.budget.grow(n)
			nb := make([]byte, len(buf), n)
			copy(nb, buf)
			buf = nb
		} else if held < cap(buf) {
			// A pooled buffer: charge what this request may fill of it.
			n := min(cap(buf), want)
			if n > held {
				if !a.budget.take(n-held, lim.MaxBufferedBytes) {
					return fail(errOverBudget)
				}
				held = n
			}
		}
		if conn != nil {
			_ = conn.SetReadDeadline(earliest(time.Now().Add(lim.BodyIdleTimeout.D()), deadline))
		}
		n, err := stream.Read(buf[len(buf):min(cap(buf), want)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Buf.Body = buf[:0]
			return fail(err)
		}
	}
	t.Buf.Body = buf[:0]
	if cl >= 0 && len(buf) >= cl {
		return buf, false, held, nil
	}
	// The rest is read and dropped: the connection stays usable and the
	// routing decision says the body was cut.
	drop := t.Buf.Drop[:]
	total := len(buf)
	for {
		if conn != nil {
			_ = conn.SetReadDeadline(earliest(time.Now().Add(lim.BodyIdleTimeout.D()), deadline))
		}
		n, err := stream.Read(drop)
		total += n
		if total > hard {
			ctx.SetConnectionClose()
			a.refuse(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", contract.ReasonBodyTooLarge, "request body too large")
			return nil, false, held, errBodyAnswered
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(err)
		}
	}
	return buf, total > len(buf), held, nil
}

var errOverBudget = errors.New("body budget exhausted")

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
