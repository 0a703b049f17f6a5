package route

import "fmt"

// Request headers the HAProxy glue (the Lua action and the SPOE agent)
// forwards to turnout besides the configured session and model headers:
// turnout logs or routes on these.
const (
	FwdContentType = "content-type"
	FwdRequestID   = "x-request-id"
	// FwdAuthorization is forwarded only for a prefill/decode deployment:
	// turnout sends the prefill itself with the client's credentials (vLLM's
	// --api-key); without PD they stay in the proxy.
	FwdAuthorization = "authorization"
)

// ForwardedHeader is one request header the glue forwards to turnout;
// Field says where it comes from in the config, for render errors.
type ForwardedHeader struct {
	Name, Field string
}

// ForwardedHeaders lists, in order, the request headers the HAProxy glue
// forwards to turnout for cfg. The Lua renderer (haproxy/) and the SPOE
// agent (route/spoe) both read this one list.
func ForwardedHeaders(cfg *Config) []ForwardedHeader {
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
			return append(out, ForwardedHeader{FwdAuthorization, FwdAuthorization})
		}
	}
	return out
}
