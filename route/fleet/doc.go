// Package fleet is the routing model every policy reads: the endpoints of
// a pool with the state that survives reloads (in-flight and decision
// counts, engine load, health, feedback and stall figures) and the
// signals a policy reads of it, one accessor each (signals.go), the Request a
// policy sees and the Choice it fills, the Policy interface with its
// optional interfaces, and the load helpers the policies share (least
// loaded, lowest load, the imbalance test), and the per-endpoint series
// writer the /metrics pages share. It imports no other route
// package but the leaves (route/kv, route/payload): every layer above
// (route/policy, route, the transports) builds on it.
package fleet
