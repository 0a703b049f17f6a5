package route

import (
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/payload"
)

// Prefill/decode disaggregation (vLLM's kv_transfer_params protocol, as the
// NIXL connector's toy proxy drives it): turnout picks a decode and a prefill
// replica, sends the prefill itself (max_tokens 1, not streamed, with
// do_remote_decode), and hands the prefill's kv_transfer_params to the proxy,
// which injects them into the request it streams to the decode replica.

// errPrefillStatus carries a prefill replica's non-2xx answer.
type errPrefillStatus struct {
	status int
	body   []byte
}

func (e *errPrefillStatus) Error() string {
	return fmt.Sprintf("prefill answered %d: %.200s", e.status, e.body)
}

// pdClient calls prefill replicas.
type pdClient struct {
	s *Server
	c *fasthttp.Client
}

func newPDClient(s *Server) *pdClient {
	return &pdClient{s: s, c: &fasthttp.Client{
		Name:                     "turnout-pd",
		NoDefaultUserAgentHeader: true,
		MaxConnsPerHost:          1024,
		MaxIdleConnDuration:      90 * time.Second,
		// Idempotent retries would re-run a prefill on a slow replica; the
		// caller retries on another replica instead.
		MaxIdemponentCallAttempts: 1,
	}}
}

// routePD serves a prefill/decode deployment.
func (s *Server) routePD(snap *Snapshot, d *Deployment, in *Input, v *Verdict, sc *scratch, start time.Time) {
	r := &sc.req
	cfg := &d.Config.PD
	if r.Truncated {
		s.m.errors[errTooLarge].Add(1)
		v.refuse(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", ReasonBodyTooLarge,
			fmt.Sprintf("prefill/decode routing needs the whole request body; it is larger than max_body (%d bytes)", snap.Config.MaxBody))
		return
	}
	if !r.Payload.Object() {
		s.m.errors[errBadBody].Add(1)
		v.refuse(fasthttp.StatusBadRequest, "invalid_request_error", "invalid_body",
			"prefill/decode routing needs a JSON object body")
		return
	}
	if r.Payload.Has(payload.KVTransferKey) {
		s.m.errors[errBadBody].Add(1)
		v.refuse(fasthttp.StatusBadRequest, "invalid_request_error", ReasonClientKVParams,
			"kv_transfer_params is set by the router; clients must not send it")
		return
	}
	n := min(1+snap.Config.Fallbacks, len(sc.picks)/2)
	s.pick(snap, d.Serve, sc, &sc.serve, sc.picks[:0:n])
	decode := sc.serve.Endpoints
	if len(decode) == 0 {
		s.refuse(v, d.Serve, sc.serve.Reject)
		return
	}
	// Skip the prefill hop when the decode replica already holds most of the
	// prompt (llm-d's heuristic): moving KV would cost more than recomputing.
	if m := sc.serve.Matched; cfg.SkipPrefillBelow > 0 && d.Serve.blockBytes > 0 && m > 0 {
		if uncached := r.PromptBytes - m*d.Serve.blockBytes; uncached < cfg.SkipPrefillBelow {
			s.m.pdPrefill[3].Add(1)
			s.route(v, d.Serve, &sc.serve, start)
			return
		}
	}
	s.pick(snap, d.Prefill, sc, &sc.prefill, sc.picks[n:n:min(2*n, len(sc.picks))])
	prefill := sc.prefill.Endpoints
	if len(prefill) == 0 {
		if cfg.NoPrefill == "aggregate" {
			s.log.Debug().Str(fieldDeployment, d.Name).Str(fieldReason, "no prefill replica").Msg("serving aggregated on decode")
			s.m.pdPrefill[4].Add(1)
			s.route(v, d.Serve, &sc.serve, start)
			return
		}
		v.RetryAfter = true
		v.refuse(fasthttp.StatusServiceUnavailable, "service_unavailable", ReasonNoPrefillEndpoint,
			"no available prefill replica in pool "+d.Prefill.Name+" (pd.no_prefill: reject)")
		return
	}
	kv, used, err := s.pd.prefillWithRetry(in, snap, d, prefill, r.Payload, cfg.PrefillTimeout.D())
	if err != nil {
		var st *errPrefillStatus
		if errors.As(err, &st) && st.status >= 400 && st.status < 500 && len(st.body) > MaxAnswerBody {
			v.refuse(st.status, "invalid_request_error", ReasonPrefillRejected,
				fmt.Sprintf("the prefill replica refused the request (status %d)", st.status))
			return
		}
		if errors.As(err, &st) && st.status >= 400 && st.status < 500 {
			// The request itself is bad (e.g. too long): the decode replica
			// would say the same, so relay the replica's own answer.
			v.Status, v.Reason, v.Body = st.status, ReasonPrefillRejected, st.body
			return
		}
		s.log.Warn().Err(err).Str(fieldDeployment, d.Name).Msg("prefill failed")
		v.refuse(fasthttp.StatusBadGateway, "server_error", ReasonPrefillFailed,
			"prefill failed on every tried replica: "+err.Error())
		return
	}
	s.route(v, d.Serve, &sc.serve, start)
	v.KVTransfer = make([]byte, base64.StdEncoding.EncodedLen(len(kv)))
	base64.StdEncoding.Encode(v.KVTransfer, kv)
	v.Prefill = used.name
	v.KVInsert, v.KVAt = payload.Edit(r.Payload, kv, nil)
	v.KVLen = len(r.Payload.Body()) + len(v.KVInsert)
}

// prefillWithRetry tries the first prefill replica, then one other.
func (c *pdClient) prefillWithRetry(in *Input, snap *Snapshot, d *Deployment, eps []*Endpoint, body *payload.Index, timeout time.Duration) ([]byte, *Endpoint, error) {
	pbody, err := payload.PrefillBody(body)
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for i, e := range eps {
		if i == 2 {
			break
		}
		kv, err := c.prefill(in, snap, e, pbody, timeout)
		if err == nil {
			if i > 0 {
				c.s.m.pdPrefill[1].Add(1)
			} else {
				c.s.m.pdPrefill[0].Add(1)
			}
			return kv, e, nil
		}
		var st *errPrefillStatus
		if errors.As(err, &st) && st.status >= 400 && st.status < 500 {
			c.s.m.pdPrefill[2].Add(1)
			return nil, e, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", e.Name, err))
	}
	c.s.m.pdPrefill[2].Add(1)
	return nil, nil, errors.Join(errs...)
}

// prefill sends one prefill request and returns its kv_transfer_params (a
// JSON object).
func (c *pdClient) prefill(in *Input, snap *Snapshot, e *Endpoint, body []byte, timeout time.Duration) ([]byte, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	uri := in.URI
	if len(uri) == 0 || uri[0] != '/' {
		uri = []byte("/v1/chat/completions")
	}
	req.SetRequestURI("http://" + e.Address + string(uri))
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	// Forward what the replica may need: auth, request id, session headers.
	for _, h := range in.Headers {
		k, v := h.Name, h.Value
		if headerIs(k, []byte(FwdAuthorization)) || headerIs(k, []byte(FwdRequestID)) {
			req.Header.SetBytesKV(k, v)
			continue
		}
		for _, h := range snap.sessionHdrs {
			if headerIs(k, h) {
				req.Header.SetBytesKV(k, v)
			}
		}
	}
	req.SetBody(body)
	e.st.inflight.Add(1)
	err := c.c.DoTimeout(req, resp, timeout)
	e.st.inflight.Add(-1)
	if err != nil {
		return nil, fmt.Errorf("prefill request: %w", err)
	}
	if sc := resp.StatusCode(); sc < 200 || sc > 299 {
		return nil, &errPrefillStatus{status: sc, body: append([]byte(nil), resp.Body()...)}
	}
	kv := payload.TopValue(resp.Body(), payload.KVTransferKey)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, fmt.Errorf("prefill response from %s has no kv_transfer_params object", e.Name)
	}
	return append([]byte(nil), kv...), nil
}

// DecodeBody injects kv_transfer_params (raw JSON object) into a request
// body, as the proxy glue does for the decode replica: payload.DecodeBody,
// the reference the Lua, njs and SPOE implementations are tested against.
func DecodeBody(body, kv []byte) ([]byte, error) {
	var x payload.Index
	x.Build(body, false)
	return payload.DecodeBody(&x, kv)
}
