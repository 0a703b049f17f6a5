package route

// The wire contract between the proxy glue (HAProxy Lua, nginx/njs) and
// turnout. Changing a name here breaks deployed proxies: keep in sync with
// lua/, templates/ and README.md.
const (
	PathRoute   = "/internal/route"
	PathDone    = "/internal/done"
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"

	// Request headers set by the proxy.
	HdrOriginalURI    = "X-Original-URI"
	HdrOriginalMethod = "X-Original-Method"
	// HdrBodyTruncated is "<have>/<full>" when the proxy could only forward a prefix of the body.
	HdrBodyTruncated = "X-Body-Truncated"

	// Response headers of a decision.
	HdrServer    = "X-Turnout-Server"
	HdrBackend   = "X-Turnout-Backend"
	HdrPool      = "X-Turnout-Pool"
	HdrFallbacks = "X-Turnout-Fallbacks"
	HdrDecision  = "X-Turnout-Decision"
	// HdrKVTransfer carries base64(JSON) kv_transfer_params for a decode replica (PD).
	HdrKVTransfer = "X-Turnout-Kv-Transfer"
	// HdrPrefill names the prefill server that did the prefill (PD).
	HdrPrefill = "X-Turnout-Prefill"
	// HdrReason explains a refusal or a fail-closed answer.
	HdrReason = "X-Turnout-Reason"

	// FeedbackTag starts the completion log line the proxies send over syslog:
	//   turnout-done id=<decision> srv=<server> status=<code> ms=<total ms>
	FeedbackTag = "turnout-done"
)
