// Package feedback closes a Decider's decisions from the proxy's
// completion feedback and watches what that feedback says: it reads the
// proxy's log lines over UDP syslog (the line of route/contract/feedback.go),
// closes the decision each names, records per-endpoint status classes,
// durations and times to first byte, notices when completions stop
// arriving, and detects stalled endpoints (a slow first byte or a decision
// open too long makes an endpoint suspect; a probe that gets no answer in
// time degrades it until one does). New hooks a Loop into the Decider's
// Run, metrics, readiness and config applies.
package feedback
