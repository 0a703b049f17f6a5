// Package pd is the prefill call of prefill/decode disaggregation, in
// vLLM's kv_transfer_params protocol (as the NIXL connector's toy proxy
// drives it): send one prefill request to one replica and return the
// kv_transfer_params it answers, or a typed error. Which replicas to try,
// retries, metrics and the verdict stay in route (pd.go); the prefill body
// is payload.PrefillBody, built from the request's one-pass index.
package pd

import (
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/payload"
)

// DefaultURI is where a prefill goes when the original request's URI is not
// a path (a proxy that did not forward it).
const DefaultURI = "/v1/chat/completions"

// ErrNoKVParams: the prefill replica answered 2xx without a
// kv_transfer_params object, so there is nothing to hand to decode.
var ErrNoKVParams = errors.New("prefill response has no kv_transfer_params object")

// StatusError is a prefill replica's non-2xx answer; callers tell a bad
// request (4xx, relayed as it is) from a failing replica with errors.As.
type StatusError struct {
	Status int
	Body   []byte // the replica's answer, copied
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("prefill answered %d: %.200s", e.Status, e.Body)
}

// Headers copies what the prefill replica needs of the original request's
// headers (auth, request id, session) into the prefill request. Which ones
// those are is routing config, so the caller decides.
type Headers interface {
	CopyTo(h *fasthttp.RequestHeader)
}

// Call is one prefill request.
type Call struct {
	Address string // host:port
	URI     []byte // the original request's path and query
	Headers Headers
	Body    []byte // payload.PrefillBody
	Timeout time.Duration
}

// Client sends prefill requests; it is safe for concurrent use.
type Client struct{ c *fasthttp.Client }

// New returns a Client with connections kept per replica.
func New() *Client {
	return &Client{c: &fasthttp.Client{
		Name:                     "turnout-pd",
		NoDefaultUserAgentHeader: true,
		MaxConnsPerHost:          1024,
		MaxIdleConnDuration:      90 * time.Second,
		// Idempotent retries would re-run a prefill on a slow replica; the
		// caller retries on another replica instead.
		MaxIdemponentCallAttempts: 1,
	}}
}

// Prefill sends call and returns the replica's kv_transfer_params (a raw
// JSON object, copied), a *StatusError for a non-2xx answer, ErrNoKVParams,
// or the transport error (fasthttp.ErrTimeout after call.Timeout), wrapped.
func (c *Client) Prefill(call *Call) ([]byte, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	uri := call.URI
	if len(uri) == 0 || uri[0] != '/' {
		uri = []byte(DefaultURI)
	}
	req.SetRequestURI("http://" + call.Address + string(uri))
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if call.Headers != nil {
		call.Headers.CopyTo(&req.Header)
	}
	req.SetBody(call.Body)
	if err := c.c.DoTimeout(req, resp, call.Timeout); err != nil {
		return nil, fmt.Errorf("prefill request: %w", err)
	}
	if sc := resp.StatusCode(); sc < 200 || sc > 299 {
		return nil, &StatusError{Status: sc, Body: append([]byte(nil), resp.Body()...)}
	}
	kv := payload.TopValue(resp.Body(), payload.KVTransferKey)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, ErrNoKVParams
	}
	return append([]byte(nil), kv...), nil
}
