package contract

import "github.com/turnout/turnout/internal/config"

// The wire contract between the proxy glue (HAProxy Lua, nginx/njs, the
// SPOE config) and turnout. The glue is rendered from these names and the
// tables of glue.go; README.md documents them. A rendered glue and
// a turnout of another version may disagree: render and reload together.
const (
	PathRoute   = "/internal/route"
	PathDone    = "/internal/done"
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"
	// PathServed is the one path prefix the proxy serves (the OpenAI API);
	// PathInternal, turnout's own, is never served to clients.
	PathServed   = "/v1/"
	PathInternal = "/internal/"

	// Request headers set by the proxy.
	HdrOriginalURI    = "X-Original-URI"
	HdrOriginalMethod = "X-Original-Method"
	// HdrBodyTruncated is "<have>/<full>" when the proxy could only forward a prefix of the body.
	HdrBodyTruncated = "X-Body-Truncated"
	// HdrDeferPD on a call asks turnout to answer a prefill/decode request
	// with HdrPD only, not deciding it: the call stays within
	// route_timeout, and the glue asks again (without HdrDeferPD) where the
	// timeout covers the prefill. A glue that never sends it gets whole
	// decisions.
	HdrDeferPD = "X-Turnout-Defer-Pd"
	// HdrPD ("1") answers HdrDeferPD for a prefill/decode request.
	HdrPD = "X-Turnout-Pd"
	// HdrRepeat ("1") marks a call that repeats one turnout refused, to
	// fetch the refusal's body (nginx header mode: auth_request keeps no
	// body): turnout answers it as any call, without counting or logging
	// the refusal again (Input.Repeat).
	HdrRepeat = "X-Turnout-Repeat"
	// HdrWant names the asked verdict fields (VerdictField.Asked) a glue
	// reads, comma-separated (VerdictField.Name): turnout writes those
	// headers only for a call that names them.
	HdrWant = "X-Turnout-Want"

	// Response headers of a decision.
	HdrServer    = "X-Turnout-Server"
	HdrBackend   = "X-Turnout-Backend"
	HdrPool      = "X-Turnout-Pool"
	HdrFallbacks = "X-Turnout-Fallbacks"
	// HdrFallbackBackend is the first fallback's address: nginx routes to
	// addresses, not names, so its retry needs it (docs/nginx.md). Asked
	// for (HdrWant): the other glues route by name.
	HdrFallbackBackend = "X-Turnout-Fallback-Backend"
	HdrDecision        = "X-Turnout-Decision"
	// HdrKVInsert (base64) and HdrKVAt are the body edit of a PD verdict:
	// the text to insert into the decode request's body (the prefill's
	// kv_transfer_params under their key) and the byte offset (BodyEdit).
	HdrKVInsert = "X-Turnout-Kv-Insert"
	HdrKVAt     = "X-Turnout-Kv-At"
	// HdrPrefill names the prefill server that did the prefill (PD).
	HdrPrefill = "X-Turnout-Prefill"
	// HdrReason explains a refusal or a fail-closed answer.
	HdrReason = "X-Turnout-Reason"
	// HdrRetryAfter goes with a refusal that asks the client to come back
	// (RetryAfterSeconds); every glue relays it with the refusal.
	HdrRetryAfter     = "Retry-After"
	RetryAfterSeconds = "1"

	// Reason codes (X-Turnout-Reason and the error body's "code") that the
	// proxy glue treats specially: PD failures are relayed, not failed over.
	ReasonPrefillFailed     = "prefill_failed"      // 502: prefill failed on every tried replica
	ReasonPrefillRejected   = "prefill_rejected"    // 4xx: the prefill replica refused the request
	ReasonNoPrefillEndpoint = "no_prefill_endpoint" // 503: PD with no_prefill=reject
	ReasonBodyTooLarge      = "body_too_large"      // 413
	ReasonDuplicateModel    = "duplicate_model"     // 400: more than one "model" key in the body
	ReasonClientKVParams    = "kv_transfer_params_not_allowed"
	ReasonNoEndpoint        = "no_endpoint" // 503: the proxy may fail open
	// ReasonSubsetEmpty (503): no endpoint of the pool is in the gateway's
	// subset hint (route/epp), which the pick may not leave.
	ReasonSubsetEmpty = "subset_empty"
	// Flow control (route/flow): a sheddable request past its queue budget
	// (429, relayed with Retry-After), and a held request whose client
	// left (503; nobody reads it).
	ReasonFlowShed = "flow_shed"
	ReasonFlowGone = "client_gone"
	// ReasonSLOShed (429, Retry-After): a request of a shedding class that
	// no replica is predicted to serve within its TTFT objective.
	ReasonSLOShed = "slo_shed"
	// ReasonModelUnavailable (503, Retry-After): endpoints served the model
	// and none that does is available now (docs/models.md); relayed.
	ReasonModelUnavailable = "model_unavailable"
	// ReasonHeaderTooLarge (431) and the others below say turnout could not
	// read the request, not that the request is wrong: the proxy applies its
	// fail mode (fail-open serves it) instead of relaying the answer.
	ReasonHeaderTooLarge = "header_too_large"
	ReasonOverloaded     = "overloaded"      // 503: limits.max_buffered_bytes or max_conns reached
	ReasonReadTimeout    = "request_timeout" // 408: the proxy stalled sending the request
	ReasonBadRequest     = "bad_request"     // 400: unreadable HTTP framing
	StatusHeaderTooLarge = 431

	// MaxAnswerBody bounds the body of any answer of turnout's (errors echo
	// at most a cut of the client's input): the nginx glue buffers the
	// answer of a subrequest in memory (subrequest_output_buffer_size).
	MaxAnswerBody = 8 << 10

	// FeedbackTag starts the completion log line the proxies send over
	// syslog; its fields are the table of feedback.go.
	FeedbackTag = "turnout-done"

	// HdrToken carries feedback.token on calls to PathDone.
	HdrToken = "X-Turnout-Token"
)

// Prefixes of the headers turnout's verdict and the glue's inputs use
// (every verdict header but Retry-After; X-Original-*).
const (
	HdrTurnoutPrefix  = "X-Turnout-"
	HdrOriginalPrefix = "X-Original-"
)

// HeaderStrip is what every glue removes from a client's request before
// anything else: nothing a client sends may pose as turnout's verdict or as
// the inputs the glue gives turnout.
type HeaderStrip struct {
	// Prefixes match by name prefix (case-insensitive), Names exactly.
	Prefixes, Names []string
}

// ClientStrip returns the headers every glue strips from client requests
// for cfg: besides the glue's own, flow control's priority and tenant
// headers unless cfg trusts them (config.UntrustedFlowHeaders), so only
// rules the operator controls can set them.
func ClientStrip(cfg *config.Config) HeaderStrip {
	return HeaderStrip{Prefixes: []string{HdrTurnoutPrefix, HdrOriginalPrefix},
		Names: append([]string{HdrBodyTruncated}, config.UntrustedFlowHeaders(cfg)...)}
}

// UnreadReasons are the 4xx reasons that mean turnout could not read the
// proxy's request (its head too large, its body stalled, its framing
// broken): not a verdict about the client's request, so the glue applies
// its fail mode instead of relaying them. Derived from reasonRules
// (glue.go).
var UnreadReasons = func() (out []string) {
	for _, r := range reasonRules {
		if r.Status < 500 && r.Action == GlueFailMode {
			out = append(out, r.Reason)
		}
	}
	return out
}()

// UnsafePathRegex matches a request path (before any "?") with a dot
// segment ("/../", "/./", plain or percent-encoded) or an encoded slash or
// backslash. The glue refuses such paths (404) before its /v1/ guard: the
// guard looks at the raw path, and a replica that resolves "/v1/../metrics"
// would serve its own /metrics. Matched case-insensitively. HAProxy 2.6's
// normalize-uri would rewrite them instead, but is experimental there.
const UnsafePathRegex = `^[^?]*(/(\.|%2e){1,2}(/|\?|$)|%2f|%5c)`

// AdminPathRegex matches the engines' admin routes under PathServed:
// vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter, which change
// what a replica serves for every client. The glue refuses them (404)
// unless proxy.expose_admin_paths is set; vLLM's other admin routes
// (/reset_prefix_cache, /sleep, /wake_up, /start_profile, ...) lie outside
// PathServed and are refused by the same guard as every other path.
// Matched case-insensitively on the raw path.
const AdminPathRegex = `^/v1/(un)?load_lora_adapter(/|\?|$)`

// AdminPathRefused is AdminPathRegex, or "" when cfg exposes the admin
// routes (proxy.expose_admin_paths).
func AdminPathRefused(cfg *config.Config) string {
	if cfg.Proxy.ExposeAdminPaths {
		return ""
	}
	return AdminPathRegex
}

// ContractLiterals are the strings this contract owns that a proxy
// template must not spell itself (it renders them from the tables): header
// names and prefixes (matched case-insensitively), the glue's error
// messages, the served paths, the feedback tag and " <key>=" of every
// feedback field. A test greps the templates for them.
func ContractLiterals() []string {
	out := []string{HdrOriginalURI, HdrOriginalMethod, HdrBodyTruncated, HdrToken, HdrTurnoutPrefix, HdrOriginalPrefix,
		PathServed, PathInternal, FeedbackTag, `{"error"`}
	for _, f := range verdictFields {
		if f.Header != "" {
			out = append(out, f.Header)
		}
	}
	for _, e := range []GlueError{FailClosedError, DecodeTooLargeError, RefusedError, NotFoundError, UpstreamFailedError, BodyTooLargeError(1)} {
		out = append(out, e.Message)
	}
	for _, f := range FeedbackLineFields() {
		out = append(out, " "+f.Key+"=")
	}
	return out
}
