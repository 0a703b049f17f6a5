package epp

import (
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
)

// The response phase closes the decision as the proxy's feedback line
// does: the status and the time to the headers (TTFB) from the response
// headers, the endpoint that served from the gateway's report
// (x-gateway-destination-endpoint-served), the duration at the end of the
// body. Nothing of the response is changed; streamed chunks pass on as
// they came.

// responseState is what the response phase learnt of the decision.
type responseState struct {
	started, closed bool
	status, ttfb    int64
	served          *fleet.Endpoint
}

func (st *stream) responseHeaders(req *procReq) error {
	if st.id != 0 && !st.resp.closed {
		r := &st.resp
		r.started = true
		r.status, r.ttfb = -1, time.Since(st.start).Milliseconds()
		for _, hv := range req.headers {
			if string(hv.name) == ":status" {
				if n, ok := atoi(hv.value); ok {
					r.status = int64(n)
				}
			}
		}
		st.noteServed(req)
		if req.eos {
			st.closeDecision()
		}
	}
	return st.goOn(fRespResponseHeaders)
}

func (st *stream) responseBody(req *procReq) error {
	if st.id != 0 {
		st.noteServed(req)
		if req.eos {
			st.resp.started = true
			st.closeDecision()
		}
	}
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return st.passOn(fRespResponseBody, req.body, req.eos)
	}
	return st.goOn(fRespResponseBody)
}

func (st *stream) responseTrailers(req *procReq) error {
	if st.id != 0 {
		st.noteServed(req)
		st.resp.started = true
		st.closeDecision()
	}
	return st.goOn(fRespResponseTrailers)
}

// noteServed keeps the endpoint the gateway says served the request.
func (st *stream) noteServed(req *procReq) {
	if st.resp.served != nil {
		return
	}
	if a := servedAddr(req); len(a) > 0 {
		st.resp.served = st.s.d.Snapshot().EndpointByAddr(a)
	}
}

// atoi is a status code's value; false when b is not a number.
func atoi(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// closeDecision completes the decision once, with what the response
// phase learnt, and feeds the endpoint's outcome (errors, durations,
// stall detection) as a feedback line would.
func (st *stream) closeDecision() {
	r := &st.resp
	if st.id == 0 || r.closed {
		return
	}
	r.closed = true
	if !r.started || r.status == 0 {
		r.status, r.ttfb = -1, -1
	}
	now := time.Now()
	ms := now.Sub(st.start).Milliseconds()
	c := route.Completion{Status: r.status, Ms: ms, TTFB: r.ttfb, Retries: -1, Served: r.served}
	state := st.s.d.Ledger().CloseDecisionWith(st.id, c)
	closed := state != nil
	if r.served != nil {
		state = r.served.State
	}
	if state != nil {
		state.Observe(r.status, ms, r.ttfb, now.UnixNano(), closed)
	}
}
