package epp

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// The request phase: the headers (pseudo-headers and forwarded headers)
// and the body become the Txn's Input; the decision is taken when the
// body is whole, or max_body of it arrived, or at once without a body.
//
// Body modes (the gateway's request_body_mode, from protocol_config; a
// gateway that does not send it is taken as FULL_DUPLEX_STREAMED, the mode
// the protocol requires):
//   - FULL_DUPLEX_STREAMED: the headers answer waits for the decision; the
//     chunks that came before it are held and sent back after it, as
//     they came; later ones pass straight through;
//   - BUFFERED: the headers are answered at once, the body comes whole and
//     its answer carries the pick (headers may still change then);
//   - NONE, or end_of_stream on the headers: decided on the headers.

// phase is where a stream is in its request.
type phase uint8

const (
	phaseHeaders phase = iota // waiting for request_headers
	phaseBody                 // headers read, the body arriving, no decision yet
	phaseRouted               // decided: the request body passes through
)

// stream is one ext_proc stream's state: one HTTP request.
type stream struct {
	s   *Server
	srv msgStream
	ctx context.Context
	ph  phase
	// The gateway's body modes (protocol_config).
	reqMode, respMode filterv3.ProcessingMode_BodySendMode

	// Until the decision: the Txn (its Input views the messages' bytes),
	// the subset hint, the body chunks held (full duplex), the bytes seen
	// and held against limits.max_buffered_bytes, the content-length.
	t      *route.Txn
	subset contract.Subset
	chunks [][]byte
	// chunkBuf is chunks' room for a body of a few chunks.
	chunkBuf [4][]byte
	seen     int
	held     int
	clen     []byte
	clBuf    [20]byte

	// The routed decision: the pick's value (ip:port,...), its id and start.
	dest    []byte
	destBuf [128]byte
	id      uint64
	start   time.Time
	resp    responseState

	ans answer // the answer being sent (sending encodes it at once)
}

// msgStream is an ext_proc stream as the picker uses it: grpc-go's server
// stream, or the inline server's; RecvMsg takes a *procReq, SendMsg an
// *answer or a proto.Message.
type msgStream interface {
	Context() context.Context
	RecvMsg(m any) error
	SendMsg(m any) error
}

func newStream(s *Server, srv msgStream) *stream {
	st := &stream{}
	st.init(s, srv)
	return st
}

func (st *stream) init(s *Server, srv msgStream) {
	*st = stream{s: s, srv: srv, ctx: srv.Context(),
		reqMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, respMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
}

// Gone tells flow control the gateway dropped a held request (flow.Watch).
func (st *stream) Gone() bool { return st.ctx.Err() != nil }

var hostB = []byte("host")

func (st *stream) requestHeaders(req *procReq) (bool, error) {
	if st.ph != phaseHeaders {
		return false, protocolError("request_headers came twice in one stream")
	}
	if req.hasConfig {
		st.reqMode, st.respMode = req.reqMode, req.respMode
	}
	d := st.s.d
	st.t = d.Begin()
	in := st.t.Input()
	in.Watch = st
	snap := d.Snapshot()
	for _, hv := range req.headers {
		name, val := hv.name, hv.value
		switch string(name) {
		case ":method":
			in.Method = val
		case ":path":
			in.URI = val
		case ":authority":
			if len(val) > 0 && snap.Forwarded(hostB) {
				in.AddHeader(hostB, val)
			}
		default:
			switch {
			case len(name) == 0 || name[0] == ':':
			case contract.HeaderIs(name, hdrContentLength):
				st.clen = val
			case len(val) > 0 && snap.Forwarded(name):
				in.AddHeader(name, val)
			}
		}
	}
	if subsetHint(req, &st.subset) {
		in.Subset = &st.subset
	}
	switch m := st.reqMode; {
	case req.eos || m == filterv3.ProcessingMode_NONE:
		routed, done, err := st.decide()
		if !routed {
			return done, err
		}
		st.ph = phaseRouted
		return false, st.routedHeaders(false)
	case m == filterv3.ProcessingMode_BUFFERED:
		st.ph = phaseBody
		return false, st.goOn(fRespRequestHeaders)
	case m == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		st.ph = phaseBody
		return false, nil
	default:
		return true, st.refuse(500, "server_error", ReasonBodyMode,
			"the gateway's ext_proc request_body_mode "+m.String()+" is not supported by turnout's Endpoint Picker: use FULL_DUPLEX_STREAMED (or BUFFERED)")
	}
}

const hdrContentLengthName = "content-length"

var hdrContentLength = []byte(hdrContentLengthName)

func (st *stream) requestBody(b *procReq) (bool, error) {
	switch st.ph {
	case phaseHeaders:
		return false, protocolError("request_body came before request_headers")
	case phaseRouted:
		if st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			return false, protocolError("request_body came after the " + st.reqMode.String() + " body was answered")
		}
		return false, st.passOn(fRespRequestBody, b.body, b.eos)
	}
	if st.reqMode == filterv3.ProcessingMode_BUFFERED {
		// The whole body in one message: the Input views it.
		in := st.t.Input()
		in.Body = b.body
		st.seen = len(in.Body)
		routed, done, err := st.decide()
		if !routed {
			return done, err
		}
		st.ph = phaseRouted
		return false, st.routedBufferedBody()
	}
	chunk := b.body
	if !st.take(len(chunk)) {
		return true, st.overloaded()
	}
	if st.chunks == nil {
		st.chunks = st.chunkBuf[:0]
	}
	st.chunks = append(st.chunks, chunk)
	st.seen += len(chunk)
	if !b.eos && st.seen <= st.t.Config().MaxBody {
		return false, nil
	}
	return st.decideStreamed(b.eos)
}

// decideStreamed decides a full-duplex request on the body held so far
// (the first max_body bytes of it), then sends the headers answer and the
// held chunks, as they came; eos: the last one ended the body.
func (st *stream) decideStreamed(eos bool) (bool, error) {
	in := st.t.Input()
	maxBody := st.t.Config().MaxBody
	in.Truncated = st.seen > maxBody
	if len(st.chunks) == 1 {
		in.Body = st.chunks[0][:min(len(st.chunks[0]), maxBody)]
	} else {
		// The one copy of each chunk: the decision reads the body whole.
		n := min(st.seen, maxBody)
		if !st.take(n) { // a pooled buffer is charged too: it is held now
			return true, st.overloaded()
		}
		buf := st.t.Buf.Body[:0]
		if cap(buf) < n {
			buf = make([]byte, 0, n)
		}
		for _, c := range st.chunks {
			if len(buf) == n {
				break
			}
			buf = append(buf, c[:min(len(c), n-len(buf))]...)
		}
		st.t.Buf.Body, in.Body = buf[:0], buf
	}
	routed, done, err := st.decide()
	if !routed {
		return done, err
	}
	st.ph = phaseRouted
	if err := st.routedHeaders(eos); err != nil {
		return false, err
	}
	for i, c := range st.chunks {
		if err := st.passOn(fRespRequestBody, c, eos && i == len(st.chunks)-1); err != nil {
			return false, err
		}
		st.chunks[i] = nil
	}
	st.chunks = st.chunks[:0]
	return false, nil
}

func (st *stream) requestTrailers() (bool, error) {
	switch st.ph {
	case phaseHeaders:
		return false, protocolError("request_trailers came before request_headers")
	case phaseBody:
		if st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			return false, protocolError("request_trailers came before the " + st.reqMode.String() + " body")
		}
		// Trailers end the body: decide on it, then answer them.
		if done, err := st.decideStreamed(false); done || err != nil {
			return done, err
		}
	}
	return false, st.goOn(fRespRequestTrailers)
}

// decide runs the Decider on the Input. Routed: the pick is in st (dest,
// id) and the Txn is given back. Not routed: the refusal was sent (done)
// or could not be (err).
func (st *stream) decide() (routed, done bool, err error) {
	d := st.s.d
	in := st.t.Input()
	if pdRequest(d, in) {
		return false, true, st.refuse(501, "invalid_request_error", ReasonPD,
			"this model is served by a prefill/decode deployment, which turnout's Endpoint Picker does not route: send it through turnout's HAProxy or nginx glue")
	}
	v := d.DecideTxn(st.t)
	if !v.Routed() {
		return false, true, st.immediate(v.Status, v.Reason, v.Body, v.RetryAfter)
	}
	picks := st.t.Picks()
	st.dest = joinAddrs(st.destBuf[:0], picks[:d.Snapshot().Config.EPP.ListedPicks(len(picks))])
	st.id, st.start = v.Decision, time.Now()
	st.endTxn()
	return true, false, nil
}

// pdRequest reports whether the request goes to a prefill/decode deployment.
func pdRequest(d *route.Decider, in *contract.Input) bool {
	for _, dep := range d.Snapshot().Deployments {
		if dep.Prefill != nil {
			return d.Prefills(in)
		}
	}
	return false
}

// joinAddrs appends the pick as the protocol writes it: ip:port,ip:port,
// the primary first, then the fallbacks in turnout's order.
func joinAddrs(b []byte, picks []*fleet.Endpoint) []byte {
	for i, e := range picks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e.Address...)
	}
	return b
}

// contentLength is the request's length for the header answer: the
// gateway's own content-length, else the body's when it was seen whole.
func (st *stream) contentLength(whole bool) []byte {
	switch {
	case len(st.clen) > 0:
		return st.clen
	case whole && st.seen > 0:
		return strconv.AppendInt(st.clBuf[:0], int64(st.seen), 10)
	}
	return nil
}

// endTxn gives the Txn and its held bytes back (nothing of the Input is
// read after).
func (st *stream) endTxn() {
	if st.held > 0 {
		st.s.budget.give(st.held)
		st.held = 0
	}
	if st.t != nil {
		st.s.d.End(st.t)
		st.t = nil
	}
}

// finish releases what the stream holds when it ends, however it ends; a
// decision whose response began is closed with what is known of it, one
// without a response phase is left to decision_ttl.
func (st *stream) finish() {
	if st.resp.started {
		st.closeDecision()
	}
	st.endTxn()
	clear(st.chunks)
	st.chunks = nil
}

// take charges n bytes held for the decision to limits.max_buffered_bytes.
func (st *stream) take(n int) bool {
	if !st.s.budget.take(n, st.t.Config().Limits.MaxBufferedBytes) {
		return false
	}
	st.held += n
	return true
}

func (st *stream) overloaded() error {
	return st.refuseRetry(503, "service_unavailable", contract.ReasonOverloaded, "too many request bytes in flight (limits.max_buffered_bytes)")
}

// send sends an answer: a *extprocv3.ProcessingResponse or an *answer.
func (st *stream) send(r any) error {
	if err := st.srv.SendMsg(r); err != nil {
		return sendError(err)
	}
	return nil
}

// budget counts the request bytes all streams hold before their decision.
type budget struct{ used atomic.Int64 }

func (b *budget) take(n, limit int) bool {
	if b.used.Add(int64(n)) > int64(limit) {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

func (b *budget) give(n int) { b.used.Add(-int64(n)) }
