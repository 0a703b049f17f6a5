// Package policy holds the routing policies (round-robin, least-request,
// session-hash, prefix-affinity with its block LRU and bounded-load guard,
// kv-aware) and the Registry that builds them by name from a pool's
// config. A policy reads the route/fleet model and fills a fleet.Choice;
// it knows nothing of the decision pipeline above it (route).
package policy
