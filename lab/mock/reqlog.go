package mock

import (
	"bytes"
	"sync"
	"time"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
)

// maxLoggedBody keeps the ring's memory bounded (256 × 1 MiB worst case).
const maxLoggedBody = 1 << 20

type headerKV struct{ k, v []byte }

// logEntry reuses its buffers across ring laps so logging costs copies, not
// allocations, at benchmark rates.
type logEntry struct {
	method, path []byte
	body         []byte
	bodySize     int
	headers      []headerKV
	receivedNs   int64
}

// requestLog is the ring behind GET /mock/requests. A nil *requestLog is a
// disabled log.
type requestLog struct {
	mu      sync.Mutex
	entries []logEntry
	next    int
	n       int
}

func newRequestLog(size int) *requestLog {
	return &requestLog{entries: make([]logEntry, size)}
}

// loggedHeader selects the headers tests care about: every X-* header
// (x-request-id, x-session-id, routing hints), the W3C trace context
// (traceparent, tracestate) and anything naming a session.
func loggedHeader(k []byte) bool {
	if len(k) >= 2 && (k[0] == 'x' || k[0] == 'X') && k[1] == '-' {
		return true
	}
	if bytes.EqualFold(k, []byte("traceparent")) || bytes.EqualFold(k, []byte("tracestate")) {
		return true
	}
	const word = "session"
	for i := 0; i+len(word) <= len(k); i++ {
		j := 0
		for j < len(word) && k[i+j]|0x20 == word[j] {
			j++
		}
		if j == len(word) {
			return true
		}
	}
	return false
}

func (l *requestLog) add(ctx *fasthttp.RequestCtx) {
	if l == nil {
		return
	}
	now := time.Now().UnixNano()
	body := ctx.PostBody()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := &l.entries[l.next]
	l.next = (l.next + 1) % len(l.entries)
	if l.n < len(l.entries) {
		l.n++
	}
	e.receivedNs = now
	e.method = append(e.method[:0], ctx.Method()...)
	e.path = append(e.path[:0], ctx.Path()...)
	e.bodySize = len(body)
	if len(body) > maxLoggedBody {
		body = nil
	}
	e.body = append(e.body[:0], body...)
	e.headers = e.headers[:0]
	for k, v := range ctx.Request.Header.All() {
		if !loggedHeader(k) {
			continue
		}
		if len(e.headers) < cap(e.headers) {
			e.headers = e.headers[:len(e.headers)+1]
		} else {
			e.headers = append(e.headers, headerKV{})
		}
		h := &e.headers[len(e.headers)-1]
		h.k = appendLower(h.k[:0], k)
		h.v = append(h.v[:0], v...)
	}
}

func appendLower(dst, s []byte) []byte {
	for _, c := range s {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

func (l *requestLog) clear() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.n, l.next = 0, 0
	l.mu.Unlock()
}

// appendJSON renders the ring oldest first:
// [{"method","path","body":<raw JSON|string|null>,"headers":{lowercased},"received_ns"}].
func (l *requestLog) appendJSON(b []byte) []byte {
	b = append(b, '[')
	if l == nil {
		return append(b, ']')
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	start := (l.next - l.n + len(l.entries)) % len(l.entries)
	for i := 0; i < l.n; i++ {
		e := &l.entries[(start+i)%len(l.entries)]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"method":`...)
		b = appendJSONString(b, string(e.method))
		b = append(b, `,"path":`...)
		b = appendJSONString(b, string(e.path))
		b = append(b, `,"body":`...)
		switch {
		case e.bodySize > maxLoggedBody:
			b = append(b, `{"_truncated":true,"size":`...)
			b = appendInt(b, int64(e.bodySize))
			b = append(b, '}')
		case len(bytes.TrimSpace(e.body)) == 0:
			b = append(b, "null"...)
		case sonic.Valid(e.body):
			b = append(b, bytes.TrimSpace(e.body)...)
		default:
			// Bad JSON is kept verbatim as a string so the dump stays valid.
			b = appendJSONString(b, string(e.body))
		}
		b = append(b, `,"headers":{`...)
		for j := range e.headers {
			h := &e.headers[j]
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, string(h.k))
			b = append(b, ':')
			b = appendJSONString(b, string(h.v))
		}
		b = append(b, `},"received_ns":`...)
		b = appendInt(b, e.receivedNs)
		b = append(b, '}')
	}
	return append(b, ']')
}
