package epp

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/turnout/turnout/route/contract"
)

// What goes back to the gateway. A pick is the same value twice, as the
// protocol requires: the x-gateway-destination-endpoint header and the
// envoy.lb dynamic metadata; the header answer clears the route cache so
// the gateway routes on it (encoded in wire.go, with the content-length,
// unchanged: the body is passed back as it came). A refusal is an ImmediateResponse with
// turnout's status, JSON error and x-turnout-reason.

// routedHeaders answers the request headers with the pick; whole: the
// body was seen to its end.
func (st *stream) routedHeaders(whole bool) error {
	st.ans = answer{kind: answerRouted, phase: fRespRequestHeaders, dest: st.dest, cl: st.contentLength(whole)}
	return st.send(&st.ans)
}

// routedBufferedBody answers a BUFFERED body with the pick; the body
// itself is left as it is.
func (st *stream) routedBufferedBody() error {
	st.ans = answer{kind: answerRouted, phase: fRespRequestBody, dest: st.dest, cl: st.contentLength(true)}
	return st.send(&st.ans)
}

// passOn passes a body chunk on unchanged in phase (request_body or
// response_body, FULL_DUPLEX_STREAMED).
func (st *stream) passOn(phase protowire.Number, chunk []byte, eos bool) error {
	st.ans = answer{kind: answerStreamed, phase: phase, chunk: chunk, eos: eos}
	return st.send(&st.ans)
}

// goOn lets phase go on unchanged: the empty answer of request_headers
// (BUFFERED), request_trailers, and the response phases.
func (st *stream) goOn(phase protowire.Number) error {
	st.ans = answer{kind: answerContinue, phase: phase}
	return st.send(&st.ans)
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// refuse answers a refusal this transport makes itself, counted with
// turnout's other refusals.
func (st *stream) refuse(status int, typ, reason, msg string) error {
	st.s.d.Refusals().NoteRefusal(status, reason, msg)
	return st.immediate(status, reason, contract.ErrorBody(typ, reason, msg), false)
}

// refuseRetry is refuse with Retry-After.
func (st *stream) refuseRetry(status int, typ, reason, msg string) error {
	st.s.d.Refusals().NoteRefusal(status, reason, msg)
	return st.immediate(status, reason, contract.ErrorBody(typ, reason, msg), true)
}

// immediate ends the request with turnout's answer instead of a replica's.
func (st *stream) immediate(status int, reason string, body []byte, retryAfter bool) error {
	if reason == "" {
		reason = "route-" + strconv.Itoa(status)
	}
	set := []*corev3.HeaderValueOption{
		setHeader("content-type", "application/json"),
		setHeader(contract.HdrReason, reason),
	}
	if retryAfter {
		set = append(set, setHeader(contract.HdrRetryAfter, contract.RetryAfterSeconds))
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    body,
		// Envoy's response code details: one token, no spaces.
		Details: "turnout_" + reason,
	}}})
}
