package contract

import (
	"fmt"
	"slices"
	"strings"

	"github.com/turnout/turnout/internal/config"
)

// Request headers the HAProxy glue (the Lua action and the SPOE agent)
// forwards to turnout besides the configured session and model headers:
// turnout logs or routes on these.
const (
	FwdContentType = "content-type"
	// FwdRequestID is the request id: the client's, else one the proxy
	// makes (HAProxy's uuid(), nginx's $request_id), set on the request
	// before turnout is asked, so turnout, the replica and the proxy's own
	// log share it (the request log's request_id).
	FwdRequestID = "x-request-id"
	// FwdAuthorization is forwarded only for a prefill/decode deployment:
	// turnout sends the prefill itself with the client's credentials (vLLM's
	// --api-key); without PD they stay in the proxy.
	FwdAuthorization = "authorization"
	// FwdTraceparent and FwdTracestate are the client's W3C trace context,
	// forwarded only with tracing on: the decision's span is its child
	// (docs/tracing.md). The proxies pass them to the replica unchanged.
	FwdTraceparent = "traceparent"
	FwdTracestate  = "tracestate"
)

// ForwardedHeader is one request header the glue forwards to turnout;
// Field says where it comes from in the config, for render errors.
type ForwardedHeader struct {
	Name, Field string
}

// ForwardedHeaders lists, in order, the request headers the HAProxy glue
// forwards to turnout for cfg. The Lua renderer (haproxy/) and the SPOE
// agent (route/spoe) both read this one list.
func ForwardedHeaders(cfg *config.Config) []ForwardedHeader {
	var out []ForwardedHeader
	for i, h := range cfg.SessionHeaders {
		out = append(out, ForwardedHeader{h, fmt.Sprintf("session_headers[%d]", i)})
	}
	for i, h := range cfg.ModelHeaders {
		out = append(out, ForwardedHeader{h, fmt.Sprintf("model_headers[%d]", i)})
	}
	out = append(out, ForwardedHeader{FwdContentType, FwdContentType}, ForwardedHeader{FwdRequestID, FwdRequestID})
	for i := range cfg.Deployments {
		if cfg.Deployments[i].IsPD() {
			out = append(out, ForwardedHeader{FwdAuthorization, FwdAuthorization})
			break
		}
	}
	if cfg.Tracing.On() {
		out = append(out, ForwardedHeader{FwdTraceparent, "tracing"}, ForwardedHeader{FwdTracestate, "tracing"})
	}
	return appendFlowHeaders(out, cfg)
}

// appendFlowHeaders adds the headers flow control reads (FlowHeaders)
// once each, for the deployments with flow_control.
func appendFlowHeaders(out []ForwardedHeader, cfg *config.Config) []ForwardedHeader {
	for i := range cfg.Deployments {
		d := &cfg.Deployments[i]
		if d.FlowControl == nil {
			continue
		}
		for _, h := range FlowHeaders(d.FlowControl) {
			n := normHeader([]byte(h))
			if !slices.ContainsFunc(out, func(f ForwardedHeader) bool { return string(normHeader([]byte(f.Name))) == string(n) }) {
				out = append(out, ForwardedHeader{h, fmt.Sprintf("deployments[%d].flow_control", i)})
			}
		}
	}
	return out
}

// FlowHeaders are the request headers flow control (route/flow) reads,
// added to the forwarded headers: the priority, tenant and TTFT
// objective headers the config trusts (an untrusted one is stripped by
// the proxy and never read), and with tenant_api_key the Authorization
// header.
func FlowHeaders(cfg *config.FlowConfig) []string {
	var h []string
	if cfg.Trust.PriorityHeader {
		h = append(h, strings.ToLower(cfg.PriorityHeader))
	}
	if cfg.Trust.TenantHeader {
		h = append(h, strings.ToLower(cfg.TenantHeader))
	}
	if cfg.Trust.SLOHeader {
		h = append(h, strings.ToLower(cfg.SLOHeader))
	}
	if cfg.TenantAPIKey {
		h = append(h, FwdAuthorization)
	}
	return h
}
