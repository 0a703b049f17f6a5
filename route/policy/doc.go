// Package policy holds the routing policies: stages (filters, scorers,
// tie-breakers, pickers, recorders; stage*.go), the Profile that runs them
// for one pool and request, the built-in policies composed of them
// (round-robin, least-request, session-hash, prefix-affinity with its block
// LRU, kv-aware, lora-affinity, predicted-ttft), policies composed in the
// config (presets, inline stages), and the one Registry of policies and
// stages that builds them by name from a pool's config (docs/policies.md). A policy reads the route/fleet model and fills a
// fleet.Choice; it knows nothing of the decision pipeline above it (route).
package policy
