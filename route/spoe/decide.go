package spoe

import (
	"bytes"
	"encoding/base64"
	"strconv"

	"github.com/turnout/turnout/internal/config"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route"
)

// The contract with the SPOE config (templates/haproxy-spoe.snippets.tmpl)
// is defined in route/contract_spoe.go, shared with the renderer; the short
// names below are the agent's spellings of it.
const (
	MessageRoute = route.SPOEMessageRoute

	ArgMethod  = route.SPOEArgMethod
	ArgURI     = route.SPOEArgURI
	ArgHeaders = route.SPOEArgHeaders
	ArgBody    = route.SPOEArgBody

	VarServer         = route.SPOEVarServer
	VarAddr           = route.SPOEVarAddr
	VarPool           = route.SPOEVarPool
	VarDecision       = route.SPOEVarDecision
	VarKVTransfer     = route.SPOEVarKVTransfer
	VarPrefill        = route.SPOEVarPrefill
	VarStatus         = route.SPOEVarStatus
	VarReason         = route.SPOEVarReason
	VarBody           = route.SPOEVarBody
	VarKV             = route.SPOEVarKV
	VarKVAt           = route.SPOEVarKVAt
	VarKVLen          = route.SPOEVarKVLen
	VarFallbackPrefix = route.SPOEVarFallbackPrefix
	MaxFallbackVars   = route.SPOEMaxFallbackVars
)

var (
	pathRouteB = []byte(route.PathRoute)
	methodPost = []byte(fasthttp.MethodPost)
	hdrCL      = []byte("content-length")
	// fallbackBody replaces a refusal body that does not fit in the ACK frame.
	fallbackBody = []byte(`{"error":{"message":"request refused by the router","type":"invalid_request_error","code":"refused"}}`)
)

// Reasons the agent gives when turnout's answer cannot be used.
const (
	reasonBadAnswer = "route-bad-answer"
	reasonBadArgs   = "spoe-bad-message"
)

// names is what the agent derives from one route config: the normalized
// names of the request headers it forwards (the same set the Lua sends:
// session and model headers, content-type, x-request-id), and whether a
// decision may block on the network (a prefill/decode deployment).
type names struct {
	cfg      *config.Config
	forward  [][]byte
	blocking bool
}

func newNames(snap *route.Snapshot) *names {
	n := &names{cfg: snap.Config}
	// The same list the Lua forwards (route/contract_forward.go).
	for _, h := range route.ForwardedHeaders(snap.Config) {
		n.forward = append(n.forward, route.NormHeader([]byte(h.Name)))
	}
	for _, d := range snap.Deployments {
		n.blocking = n.blocking || d.Prefill != nil
	}
	return n
}

func (n *names) forwarded(name []byte) bool {
	for _, f := range n.forward {
		if route.HeaderIs(name, f) {
			return true
		}
	}
	return false
}

// decider turns messages into verdicts. It owns a RequestCtx reused for
// every message, so one decider serves one goroutine at a time.
type decider struct {
	srv   *route.Server
	names func(*route.Snapshot) *names
	ctx   fasthttp.RequestCtx
	args  []arg
	tmp   []byte
	kv    []byte // PD: decoded kv_transfer_params, then the insertion text
}

func newDecider(srv *route.Server, names func(*route.Snapshot) *names) *decider {
	return &decider{srv: srv, names: names, args: make([]arg, 0, 8), tmp: make([]byte, 0, 64)}
}

// actions appends set-var actions (txn scope) to an ACK frame, dropping any
// that would make it longer than limit (the negotiated max-frame-size).
type actions struct {
	dst   []byte
	limit int
}

func (w *actions) setString(name string, v []byte) {
	if len(v) > 0 && w.fits(name, len(v)) {
		w.dst = appendSetVar(w.dst, scopeTxn, name, v)
	}
}

func (w *actions) setInt(name string, v int32) {
	if w.fits(name, 5) {
		w.dst = appendSetVarInt(w.dst, scopeTxn, name, v)
	}
}

func (w *actions) fits(name string, n int) bool {
	return len(w.dst)+setVarLen(name, n) <= w.limit
}

// notify answers one NOTIFY payload: the set-var actions for every
// MessageRoute message are appended to dst, which does not grow past limit.
func (d *decider) notify(payload, dst []byte, limit int) ([]byte, error) {
	w := actions{dst: dst, limit: limit}
	it := msgIter{b: payload}
	for {
		name, args, ok := it.next(d.args)
		if !ok {
			break
		}
		d.args = args[:0]
		if string(name) == MessageRoute {
			d.route(args, &w)
		}
	}
	return w.dst, it.err
}

// route runs one decision through turnout's HTTP handler and writes the
// verdict as set-var actions.
func (d *decider) route(args []arg, w *actions) {
	var method, uri, hdrs, body []byte
	hasHdrs := false
	for i := range args {
		a := &args[i]
		switch string(a.Name) {
		case ArgMethod:
			method = a.Value.Bytes
		case ArgURI:
			uri = a.Value.Bytes
		case ArgHeaders:
			hdrs, hasHdrs = a.Value.Bytes, a.Value.Type == typeBinary || a.Value.Type == typeString
		case ArgBody:
			body = a.Value.Bytes
		}
	}
	if !hasHdrs {
		// The config does not send what turnout routes on: not routing is
		// safer than routing on nothing.
		w.setInt(VarStatus, 500)
		w.setString(VarReason, []byte(reasonBadArgs))
		return
	}

	snap := d.srv.Snapshot()
	nm := d.names(snap)
	req := &d.ctx.Request
	req.Reset()
	d.ctx.Response.Reset()
	req.Header.DisableNormalizing()
	req.Header.SetMethodBytes(methodPost)
	req.SetRequestURIBytes(pathRouteB)

	fullLen := -1
	if !walkHeaders(hdrs, func(k, v []byte) {
		switch {
		case route.HeaderIs(k, hdrCL):
			if n, err := strconv.Atoi(unsafeString(v)); err == nil {
				fullLen = n
			}
		case nm.forwarded(k):
			req.Header.SetBytesKV(k, v)
		}
	}) {
		w.setInt(VarStatus, 500)
		w.setString(VarReason, []byte(reasonBadArgs))
		return
	}
	req.Header.SetBytesV(route.HdrOriginalURI, uri)
	req.Header.SetBytesV(route.HdrOriginalMethod, method)
	if fullLen > len(body) {
		// HAProxy's req.body stops at one buffer: say what is missing, as the Lua does.
		d.tmp = strconv.AppendInt(d.tmp[:0], int64(len(body)), 10)
		d.tmp = append(d.tmp, '/')
		d.tmp = strconv.AppendInt(d.tmp, int64(fullLen), 10)
		req.Header.SetBytesV(route.HdrBodyTruncated, d.tmp)
	}
	req.SetBodyRaw(body)

	d.srv.Handler(&d.ctx)
	d.verdict(w, body)
	// Drop the views into the frame: it is reused once the ACK is out.
	req.SetBodyRaw(nil)
}

// verdict maps turnout's HTTP answer to set-var actions.
func (d *decider) verdict(w *actions, body []byte) {
	resp := &d.ctx.Response
	h := &resp.Header
	st := resp.StatusCode()
	switch {
	case st == fasthttp.StatusOK || st == fasthttp.StatusNoContent:
		srv := h.Peek(route.HdrServer)
		if len(srv) == 0 {
			w.setInt(VarStatus, 502)
			w.setString(VarReason, []byte(reasonBadAnswer))
			return
		}
		if kv := h.Peek(route.HdrKVTransfer); len(kv) > 0 {
			// Checked before any variable is set: a bad answer fails whole.
			at, ok := d.kvInsert(kv, body)
			if !ok {
				w.setInt(VarStatus, 502)
				w.setString(VarReason, []byte(reasonBadAnswer))
				return
			}
			w.setString(VarKV, d.kv)
			w.setInt(VarKVAt, int32(at))
			w.setInt(VarKVLen, int32(len(body)+len(d.kv)))
		}
		w.setString(VarServer, srv)
		w.setString(VarAddr, h.Peek(route.HdrBackend))
		w.setString(VarPool, h.Peek(route.HdrPool))
		w.setString(VarDecision, h.Peek(route.HdrDecision))
		fb := h.Peek(route.HdrFallbacks)
		for i := 0; i < MaxFallbackVars && len(fb) > 0; {
			var name []byte
			name, fb, _ = bytes.Cut(fb, []byte{','})
			if name = bytes.TrimSpace(name); len(name) > 0 {
				w.setString(route.SPOEFallbackVar(i), name)
				i++
			}
		}
		w.setString(VarKVTransfer, h.Peek(route.HdrKVTransfer))
		w.setString(VarPrefill, h.Peek(route.HdrPrefill))
	case st >= 400 && st < 500:
		if !route.SPOERelaysStatus(st) {
			st = fasthttp.StatusBadRequest
		}
		w.setInt(VarStatus, int32(st))
		w.setString(VarReason, d.token(h.Peek(route.HdrReason), st))
		// turnout's refusals (and the prefill replica's it relays) are JSON;
		// one too long for the frame is replaced, never cut.
		body := resp.Body()
		if !w.fits(VarBody, len(body)) {
			body = fallbackBody
		}
		w.setString(VarBody, body)
	default:
		// No endpoint, tokenizer down...: the fail mode in haproxy.cfg
		// decides, with turnout's reason. PD failures are relayed as they are.
		w.setInt(VarStatus, int32(st))
		reason := d.token(h.Peek(route.HdrReason), st)
		w.setString(VarReason, reason)
		if route.SPOERelaysPD(st, reason) {
			if b := resp.Body(); w.fits(VarBody, len(b)) {
				w.setString(VarBody, b)
			} else {
				w.setString(VarBody, fallbackBody)
			}
		}
	}
}

// kvInsert builds the text the decode backend's filter inserts into body --
// '"kv_transfer_params":<obj>,' right after the opening brace, without the
// comma when the object is empty, exactly route.DecodeBody -- into d.kv and
// returns the 0-based offset just after the brace.
func (d *decider) kvInsert(b64, body []byte) (int, bool) {
	n := base64.StdEncoding.DecodedLen(len(b64))
	if cap(d.kv) < n+len(kvKey)+1 {
		d.kv = make([]byte, 0, 2*(n+len(kvKey)+1))
	}
	raw := d.kv[len(kvKey) : len(kvKey)+n]
	m, err := base64.StdEncoding.Decode(raw, b64)
	if err != nil || m < 2 || raw[0] != '{' || raw[m-1] != '}' {
		return 0, false
	}
	open := bytes.IndexByte(body, '{')
	if open < 0 {
		return 0, false
	}
	out := append(d.kv[:0], kvKey...) // raw sits right after kvKey: no copy
	out = out[:len(kvKey)+m]
	rest := bytes.TrimLeft(body[open+1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '}' {
		out = append(out, ',')
	}
	d.kv = out
	return open + 1, true
}

const kvKey = `"kv_transfer_params":`

// token keeps a reason to [A-Za-z0-9_.-] (it ends up in a response header
// and a JSON string); an empty one becomes "route-<status>".
func (d *decider) token(r []byte, status int) []byte {
	out := d.tmp[:0]
	for _, c := range r {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		out = strconv.AppendInt(append(out, "route-"...), int64(status), 10)
	}
	d.tmp = out
	return out
}

// walkHeaders calls fn for each header of a req.hdrs_bin block:
// (<varint len><name><varint len><value>)* ended by two empty strings.
// It reports false on a malformed block.
func walkHeaders(b []byte, fn func(k, v []byte)) bool {
	for len(b) > 0 {
		k, n, err := readBytes(b)
		if err != nil {
			return false
		}
		b = b[n:]
		v, n, err := readBytes(b)
		if err != nil {
			return false
		}
		b = b[n:]
		if len(k) == 0 && len(v) == 0 {
			return true
		}
		fn(k, v)
	}
	// HAProxy always ends the block; a missing end means it was cut.
	return false
}
