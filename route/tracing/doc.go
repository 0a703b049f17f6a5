// Package tracing exports one OpenTelemetry span per decision over OTLP
// (gRPC or HTTP), parented to the client's W3C traceparent and sampled by
// the tracing section of the config (docs/tracing.md). It implements
// route.Tracer: the Decider hands it each finished decision, and the SDK's
// batch span processor exports off the decision's goroutine, dropping
// spans rather than blocking when the receiver falls behind.
package tracing
