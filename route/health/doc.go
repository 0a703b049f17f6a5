// Package health checks a Decider's endpoints actively: the health path of
// every endpoint each interval (down after health.fails failures, up on the
// first success), the model names each replica serves (GET /v1/models,
// checked in the background and, for static endpoints, verified at load).
// It only changes endpoints' health state; decisions read it.
package health
