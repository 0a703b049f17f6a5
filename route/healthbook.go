package route

import "sync/atomic"

// HealthBook is what the Decider knows of active health checks: how many
// passed and failed (/metrics), and whether a full round finished
// (readiness trusts endpoints' health from then on). route/health writes
// it through Decider.Health.
type HealthBook struct {
	checks [2]atomic.Uint64 // passed, failed
	round  atomic.Bool
}

// NoteHealthCheck counts one active health check (route/health).
func (h *HealthBook) NoteHealthCheck(ok bool) {
	if ok {
		h.checks[0].Add(1)
	} else {
		h.checks[1].Add(1)
	}
}

// HealthChecks is how many active health checks passed and failed.
func (h *HealthBook) HealthChecks() (ok, failed uint64) {
	return h.checks[0].Load(), h.checks[1].Load()
}

// HealthRoundDone notes that a full round of health checks finished:
// readiness trusts endpoints' health from then on.
func (h *HealthBook) HealthRoundDone() { h.round.Store(true) }

// HealthRounded reports whether a full round of health checks finished.
func (h *HealthBook) HealthRounded() bool { return h.round.Load() }
