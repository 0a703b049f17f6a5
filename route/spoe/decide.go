package spoe

import (
	"strconv"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// The contract with the SPOE config (templates/haproxy-spoe.snippets.tmpl)
// is defined in route/contract/spoe.go, shared with the renderer; the short
// names below are the agent's spellings of it.
const (
	MessageRoute   = contract.SPOEMessageRoute
	MessageRoutePD = contract.SPOEMessageRoutePD

	ArgMethod  = contract.SPOEArgMethod
	ArgURI     = contract.SPOEArgURI
	ArgHeaders = contract.SPOEArgHeaders
	ArgBody    = contract.SPOEArgBody
	ArgDeferPD = contract.SPOEArgDeferPD
	ArgSent    = contract.SPOEArgSent

	VarServer         = contract.SPOEVarServer
	VarPool           = contract.SPOEVarPool
	VarDecision       = contract.SPOEVarDecision
	VarKVTransfer     = contract.SPOEVarKVTransfer
	VarPrefill        = contract.SPOEVarPrefill
	VarStatus         = contract.SPOEVarStatus
	VarReason         = contract.SPOEVarReason
	VarBody           = contract.SPOEVarBody
	VarRetryAfter     = contract.SPOEVarRetryAfter
	VarPD             = contract.SPOEVarPD
	VarKV             = contract.SPOEVarKV
	VarKVAt           = contract.SPOEVarKVAt
	VarKVLen          = contract.SPOEVarKVLen
	VarFallbackPrefix = contract.SPOEVarFallbackPrefix
	MaxFallbackVars   = contract.SPOEMaxFallbackVars
)

var (
	hdrCL = []byte("content-length")
	// fallbackBody replaces a relayed body that is empty or does not fit in the ACK frame.
	fallbackBody = []byte(contract.RefusedError.JSON())
	retryAfter   = []byte(contract.RetryAfterSeconds)
)

// Reasons the agent gives when turnout's answer cannot be used.
const (
	reasonBadAnswer = contract.BadAnswerReason
	reasonBadArgs   = "spoe-bad-message"
)

// names is what the agent derives from one route config: whether a
// decision may block on the network (a prefill/decode deployment).
type names struct {
	cfg      *config.Config
	blocking bool
	// askMs is HAProxy's timeout processing of MessageRoute.
	askMs int64
}

func newNames(snap *route.Snapshot) *names {
	n := &names{cfg: snap.Config, askMs: snap.Config.RouteAskTimeout().Milliseconds()}
	for _, d := range snap.Deployments {
		// Flow control holds decisions: they must not hold up the
		// connection's other frames either.
		n.blocking = n.blocking || d.Prefill != nil || d.Config.FlowControl != nil
	}
	return n
}

// decider turns messages into verdicts: SPOE arguments into a contract.Input,
// route.Decider.Decide, the contract.Verdict into set-var actions. It owns the
// Input and Verdict reused for every message, so one decider serves one
// goroutine at a time.
type decider struct {
	srv   *route.Decider
	names func(*route.Snapshot) *names
	in    contract.Input
	v     contract.Verdict
	args  []arg
	tmp   []byte
	// watch is the connection of the frame being decided (worker mode):
	// flow control drops a held request whose connection closed.
	watch interface{ Gone() bool }
	// late is the agent's (Agent.decider): messages HAProxy already gave
	// up on.
	late *lateness
}

func newDecider(srv *route.Decider, names func(*route.Snapshot) *names) *decider {
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
		switch string(name) {
		case MessageRoute, MessageRoutePD:
			d.route(args, &w)
		}
	}
	return w.dst, it.err
}

// route reads one message's arguments into an Input, decides, and writes
// the verdict as set-var actions. With ArgDeferPD (the first agent's
// message), a prefill/decode request is not decided but marked (VarPD) for
// the second agent, so that call never waits on a prefill.
func (d *decider) route(args []arg, w *actions) {
	in := &d.in
	in.Reset()
	if d.watch != nil {
		in.Watch = d.watch
	}
	var hdrs []byte
	var sent int64
	hasHdrs, deferPD := false, false
	for i := range args {
		a := &args[i]
		switch string(a.Name) {
		case ArgMethod:
			in.Method = a.Value.Bytes
		case ArgURI:
			in.URI = a.Value.Bytes
		case ArgHeaders:
			hdrs, hasHdrs = a.Value.Bytes, a.Value.Type == typeBinary || a.Value.Type == typeString
		case ArgBody:
			in.Body = a.Value.Bytes
		case ArgDeferPD:
			deferPD = a.Value.Type == typeBool && a.Value.Bool
		case ArgSent:
			sent = a.Value.Int + int64(a.Value.Uint)
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
	if sent > 0 && d.late != nil && d.late.late(time.Now().UnixMilli(), sent, nm.askMs) {
		// HAProxy balanced this request by itself already: the answer
		// would be dropped, and a decision would stay open.
		d.srv.Refusals().NoteRefusal(503, contract.ReasonFlowGone, "SPOE message read after HAProxy's timeout processing (turnout was paused?): not decided")
		in.Reset()
		return
	}
	fullLen := -1
	if !walkHeaders(hdrs, func(k, v []byte) {
		switch {
		case contract.HeaderIs(k, hdrCL):
			if n, err := strconv.Atoi(unsafeString(v)); err == nil {
				fullLen = n
			}
		case len(v) > 0:
			if role := snap.ForwardedRole(k); role != 0 {
				in.AddHeaderRole(k, v, role) // matched once: the decision reads the role
			}
		}
	}) {
		w.setInt(VarStatus, 500)
		w.setString(VarReason, []byte(reasonBadArgs))
		return
	}
	// HAProxy's req.body stops at one buffer (or route_body bytes).
	in.Truncated = fullLen > len(in.Body)
	if deferPD && nm.blocking && d.srv.Prefills(in) {
		w.setInt(VarPD, 1)
		in.Reset()
		return
	}
	d.srv.Decide(in, &d.v)
	if sent > 0 && d.late != nil && d.v.Decision != 0 && d.late.past(time.Now().UnixMilli(), sent, nm.askMs) {
		// Decided too late (a stop during the decision): HAProxy stopped
		// waiting.
		d.srv.Ledger().Abandon(d.v.Decision)
	}
	d.verdict(w)
	// Drop the views into the frame: it is reused once the ACK is out.
	in.Reset()
}

// verdict writes the Verdict as set-var actions (the SPOEVar names of
// route/contract/glue.go).
func (d *decider) verdict(w *actions) {
	v := &d.v
	if v.Routed() {
		if len(v.KVInsert) > 0 {
			// Checked before any variable is set: a bad edit fails whole.
			if v.KVAt < 0 {
				w.setInt(VarStatus, 502)
				w.setString(VarReason, []byte(reasonBadAnswer))
				return
			}
			w.setString(VarKV, v.KVInsert)
			w.setInt(VarKVAt, int32(v.KVAt))
			w.setInt(VarKVLen, int32(v.KVLen))
		}
		fields := contract.RoutedFields()
		for i := range fields {
			if f := &fields[i]; f.SPOEVar != "" {
				w.setString(f.SPOEVar, f.Value(v))
			}
		}
		for i, fb := range v.Fallbacks {
			if i == MaxFallbackVars {
				break
			}
			w.setString(contract.SPOEFallbackVar(i), fb)
		}
		return
	}
	reason := d.token(v.Reason, v.Status)
	if contract.GlueActionFor(v.Status, reason) != contract.GlueRelay {
		// No endpoint, tokenizer down...: the fail mode in haproxy.cfg
		// decides, with turnout's reason.
		w.setInt(VarStatus, int32(v.Status))
		w.setString(VarReason, reason)
		return
	}
	// Relayed: the config answers status, reason and body when the body
	// is set; one too long for the frame is replaced, never cut.
	w.setInt(VarStatus, int32(contract.RelayStatus(v.Status)))
	w.setString(VarReason, reason)
	body := v.Body
	if len(body) == 0 || !w.fits(VarBody, len(body)) {
		body = fallbackBody
	}
	w.setString(VarBody, body)
	if v.RetryAfter {
		w.setString(VarRetryAfter, retryAfter)
	}
}

// token keeps a reason to [A-Za-z0-9_.-] (it ends up in a response header
// and a JSON string); an empty one becomes "route-<status>".
func (d *decider) token(r string, status int) []byte {
	out := d.tmp[:0]
	for i := 0; i < len(r); i++ {
		c := r[i]
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
