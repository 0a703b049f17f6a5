// Package httpapi is turnout's HTTP transport over a route.Decider:
// POST /internal/route reads the proxy's call (the forwarded headers, the
// original method and URI, the body up to max_body within the
// buffered-bytes budget) into the Decider's Input and writes the Verdict
// as X-Turnout-* headers or an OpenAI-style error; /internal/done closes a
// decision; /healthz, /readyz and /metrics report. It also builds the
// fasthttp server those run on (limits from the config) and answers
// connections over limits.max_conns (OverloadedAnswer).
package httpapi
