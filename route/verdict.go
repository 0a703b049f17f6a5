package route

import (
	"encoding/json"
	"github.com/turnout/turnout/route/fleet"
	"time"
)

// Header is one forwarded request header, as views.
type Header struct {
	Name, Value []byte
	// role is what the transport already matched the name as (0: not
	// matched; decideInput matches it).
	role hdrRole
}

// Input is what the proxy sent turnout about one request, whatever the
// transport (the HTTP call of handler.go, an SPOE message of route/spoe).
// Every slice is a view into the transport's buffers, valid during Decide.
type Input struct {
	// Method and URI are the client's (X-Original-Method, X-Original-URI).
	Method, URI []byte
	// Headers are the forwarded request headers (ForwardedHeaders); names
	// are matched without regard to case or '-'/'_'.
	Headers []Header
	// Body is the request body, or its first bytes when Truncated.
	Body      []byte
	Truncated bool
}

// Reset empties in, keeping the header slice's room for the next request.
func (in *Input) Reset() {
	*in = Input{Headers: in.Headers[:0]}
}

// AddHeader appends a forwarded header (views).
func (in *Input) AddHeader(name, value []byte) {
	in.Headers = append(in.Headers, Header{Name: name, Value: value})
}

// addHeader appends a forwarded header whose role the transport found
// (Snapshot.forwardedRole), so decideInput does not compare its name again.
func (in *Input) addHeader(name, value []byte, role hdrRole) {
	in.Headers = append(in.Headers, Header{Name: name, Value: value, role: role})
}

// Verdict is everything turnout answers about one request. The HTTP
// handler writes it as X-Turnout-* headers (or an error answer), the SPOE
// agent as txn variables; the field names are in contract_glue.go. The
// slices are views into the snapshot (names, which never change) or into
// the Verdict's own buffers: valid until the Verdict is reused.
type Verdict struct {
	// Status is 200 when a replica was chosen; otherwise the refusal's
	// status, with Reason and Body.
	Status int
	// Server, Addr and Pool name the chosen replica, its address and its
	// pool (the proxy's backend).
	Server, Addr, Pool []byte
	// Fallbacks are the servers to try after Server, in order.
	Fallbacks [][]byte
	// Decision is the id the proxy's feedback closes (DecisionHex).
	Decision uint64
	// PD: KVTransfer is base64(kv_transfer_params), Prefill the prefill
	// server that ran. KVInsert is inserted into the body at byte offset
	// KVAt, which makes the body KVLen bytes long (BodyEdit).
	KVTransfer []byte
	Prefill    []byte
	KVInsert   []byte
	KVAt       int
	KVLen      int
	// Reason is the reason code of a refusal (X-Turnout-Reason).
	Reason string
	// Body is a refusal's OpenAI-style JSON error (or the prefill
	// replica's own 4xx answer).
	Body []byte
	// RetryAfter asks the client to retry in a second.
	RetryAfter bool

	fb  [16][]byte
	hex [16]byte
}

// Routed reports whether v names a replica.
func (v *Verdict) Routed() bool { return v.Status == 200 }

// DecisionHex returns the decision id as 16 hex digits (X-Turnout-Decision).
func (v *Verdict) DecisionHex() []byte { return appendID(v.hex[:0], v.Decision) }

// reset empties v field by field: the fallback and hex buffers are only
// read through Fallbacks and DecisionHex, so they need no clearing.
func (v *Verdict) reset() {
	v.Status, v.Server, v.Addr, v.Pool, v.Fallbacks, v.Decision = 0, nil, nil, nil, nil, 0
	v.KVTransfer, v.Prefill, v.KVInsert, v.KVAt, v.KVLen = nil, nil, nil, 0, 0
	v.Reason, v.Body, v.RetryAfter = "", nil, false
}

// refuse makes v an OpenAI-style error answer. Errors are rare, so
// encoding/json's allocations are fine here.
func (v *Verdict) refuse(status int, typ, code, msg string) {
	v.Status, v.Reason = status, code
	v.Body = errorBody(typ, code, msg)
}

// errorBody is the OpenAI error envelope, bounded by MaxAnswerBody.
func errorBody(typ, code, msg string) []byte {
	if len(msg) > MaxAnswerBody/2 { // JSON escaping may double it
		msg = msg[:MaxAnswerBody/2-3] + "..."
	}
	b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
	return b
}

// Decide is the one decision entry point: it routes in and fills v.
func (s *Server) Decide(in *Input, v *Verdict) {
	snap := s.snap.Load()
	sc := s.getScratch(snap.maxBlocks)
	s.decideInput(snap, in, v, sc, time.Now())
	s.release(sc)
}

// decideInput runs the stages of doc.go after the read: deployment, pick,
// verdict. start is when the request reached turnout.
func (s *Server) decideInput(snap *Snapshot, in *Input, v *Verdict, sc *scratch, start time.Time) {
	v.reset()
	cfg := snap.Config
	r := &sc.req
	*r = fleet.Request{Truncated: in.Truncated}
	body := in.Body
	if len(body) > cfg.MaxBody {
		body, r.Truncated = body[:cfg.MaxBody], true
	}
	var modelHdr []byte
	for i := range in.Headers {
		h := &in.Headers[i]
		if len(h.Value) == 0 {
			continue
		}
		role := h.role
		if role == 0 {
			role = snap.headerRole(h.Name)
		}
		if role&hdrSession != 0 {
			r.Session = h.Value
		}
		if role&hdrModel != 0 {
			modelHdr = h.Value
		}
	}

	// The one pass over the body (route/payload): later stages read the index.
	sc.idx.Reset() // a new request: its scan count starts at zero
	sc.idx.Build(body, r.Truncated)
	r.Payload = &sc.idx
	model := sc.idx.Model()
	if len(model) == 0 {
		model = modelHdr
	}
	r.Model = model
	var d *Deployment
	switch {
	case len(model) > 0:
		d = snap.byModel[string(model)]
		if d == nil {
			s.m.errors[errUnknownModel].Add(1)
			v.refuse(404, "invalid_request_error", "model_not_found",
				"The model `"+string(cut(model, maxEchoModel))+"` does not exist.")
			return
		}
	case len(snap.Deployments) == 1:
		d = snap.Deployments[0]
	default:
		s.m.errors[errNoModel].Add(1)
		v.refuse(400, "invalid_request_error", "model_required",
			"a \"model\" is required: several deployments are served")
		return
	}
	if len(r.Session) > 0 {
		r.HasSession = true
		r.SessionHash = fleet.HashKey(r.Session)
	}
	if d.Prefill != nil {
		s.routePD(snap, d, in, v, sc, start)
		return
	}
	s.decide(snap, d.Serve, v, sc, start)
}

// decide runs the pool's policy and fills the verdict.
func (s *Server) decide(snap *Snapshot, p *fleet.Pool, v *Verdict, sc *scratch, start time.Time) *fleet.Endpoint {
	c := &sc.serve
	s.pick(snap, p, sc, c, sc.picks[:0:min(1+snap.Config.Fallbacks, len(sc.picks))])
	if len(c.Endpoints) == 0 {
		s.refuse(v, p, c.Reject)
		return nil
	}
	s.route(v, p, c, start)
	return c.Endpoints[0]
}

// route opens the decision for the policy's first pick and fills v with it.
func (s *Server) route(v *Verdict, p *fleet.Pool, c *fleet.Choice, start time.Time) {
	picks := c.Endpoints
	e := picks[0]
	v.Status = 200
	v.Decision = s.dec.open(e, start.UnixNano())
	v.Server, v.Addr, v.Pool = e.NameHdr, e.AddrHdr, p.NameHdr
	v.Fallbacks = v.fb[:0]
	for _, f := range picks[1:] {
		v.Fallbacks = append(v.Fallbacks, f.NameHdr)
	}
	// One decision in latencySample is timed: a clock read costs about as
	// much as a round-robin pick on some VMs, and ids are random, so the
	// sample is unbiased.
	if v.Decision%latencySample == 0 {
		p.Metrics.Latency.Observe(time.Since(start))
	}
}

// latencySample: the decision latency histogram times one decision in this many.
const latencySample = 8

// refuse answers a request no endpoint was picked for.
func (s *Server) refuse(v *Verdict, p *fleet.Pool, why fleet.RejectReason) {
	switch why {
	case fleet.RejectBadBody:
		s.m.errors[errBadBody].Add(1)
		v.refuse(400, "invalid_request_error", "token_ids_required",
			"pool "+p.Name+" routes on token ids (strict): send a prompt the tokenizer can read or token ids")
	case fleet.RejectUnavailable:
		v.RetryAfter = true
		v.refuse(503, "service_unavailable", "tokenizer_unavailable",
			"pool "+p.Name+" routes on token ids (strict) and the tokenizer is unavailable")
	default:
		v.RetryAfter = true
		v.refuse(503, "service_unavailable", ReasonNoEndpoint, "no available endpoint in pool "+p.Name)
	}
}

// forwarded reports whether the raw header name is one of ForwardedHeaders.
func (s *Snapshot) forwarded(name []byte) bool { return s.forwardedRole(name) != 0 }

// forwardedRole is the role of the raw header name when it is one of
// ForwardedHeaders, else 0.
func (s *Snapshot) forwardedRole(name []byte) hdrRole {
	for i, f := range s.fwdHdrs {
		if headerIs(name, f) {
			return s.fwdRoles[i]
		}
	}
	return 0
}

// Forwarded is forwarded for the transports outside this package (SPOE).
func (s *Snapshot) Forwarded(name []byte) bool { return s.forwarded(name) }
