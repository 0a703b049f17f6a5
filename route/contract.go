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

	// Reason codes (X-Turnout-Reason and the error body's "code") that the
	// proxy glue treats specially: PD failures are relayed, not failed over.
	ReasonPrefillFailed     = "prefill_failed"      // 502: prefill failed on every tried replica
	ReasonPrefillRejected   = "prefill_rejected"    // 4xx: the prefill replica refused the request
	ReasonNoPrefillEndpoint = "no_prefill_endpoint" // 503: PD with no_prefill=reject
	ReasonBodyTooLarge      = "body_too_large"      // 413
	ReasonClientKVParams    = "kv_transfer_params_not_allowed"
	ReasonNoEndpoint        = "no_endpoint" // 503: the proxy may fail open

	// FeedbackTag starts the completion log line the proxies send over syslog:
	//   turnout-done id=<decision> srv=<server> status=<code> ms=<total ms> ttfb=<ms> [tok=<token>]
	// Fields are space-separated key=value pairs in any order; unknown keys
	// are ignored. ttfb is the time to the replica's response headers
	// (HAProxy %Tr, nginx $upstream_header_time); -1 or "-" when unknown.
	FeedbackTag = "turnout-done"

	FeedbackFieldID     = "id"
	FeedbackFieldServer = "srv"
	FeedbackFieldStatus = "status"
	FeedbackFieldMs     = "ms"
	FeedbackFieldTTFB   = "ttfb"
	// FeedbackFieldToken carries feedback.token when one is configured.
	FeedbackFieldToken = "tok"

	// HdrToken carries feedback.token on calls to PathDone.
	HdrToken = "X-Turnout-Token"
)

// FeedbackAuthField is the log-format text that carries the feedback token
// ("" without a token), rendered into the HAProxy and nginx log formats.
func FeedbackAuthField(cfg *Config) string {
	if cfg.Feedback.Token == "" {
		return ""
	}
	return FeedbackFieldToken + "=" + cfg.Feedback.Token
}
