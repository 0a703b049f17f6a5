package route

import (
	"sync"
	"sync/atomic"
	"time"
)

// decisions tracks in-flight decisions until the proxy reports completion or
// the TTL expires them. A fixed ring of slots indexed by id keeps the hot
// path allocation-free; an id that wraps onto a still-open slot expires the
// old decision (counted), so memory stays bounded under any load.
type decisions struct {
	slots []decisionSlot
	mask  uint64
	next  atomic.Uint64

	completed   atomic.Uint64
	unknown     atomic.Uint64
	duplicate   atomic.Uint64
	expired     atomic.Uint64
	overwritten atomic.Uint64
}

type decisionSlot struct {
	mu    sync.Mutex
	id    uint64
	st    *endpointState
	start int64 // unix nanos
}

func newDecisions(size int, seed uint64) *decisions {
	n := 1
	for n < size {
		n <<= 1
	}
	d := &decisions{slots: make([]decisionSlot, n), mask: uint64(n - 1)}
	// Start at a random offset so completions meant for a previous process
	// do not match this one's ids.
	d.next.Store(seed &^ (1 << 63))
	return d
}

// open records a decision for e and returns its id.
func (d *decisions) open(e *Endpoint, now int64) uint64 {
	id := d.next.Add(1)
	s := &d.slots[id&d.mask]
	s.mu.Lock()
	if s.st != nil {
		s.st.inflight.Add(-1)
		d.overwritten.Add(1)
	}
	s.id, s.st, s.start = id, e.st, now
	s.mu.Unlock()
	e.st.inflight.Add(1)
	e.st.decisions.Add(1)
	return id
}

// close completes a decision; unknown and duplicate ids are counted and ignored.
func (d *decisions) close(id uint64) bool {
	s := &d.slots[id&d.mask]
	s.mu.Lock()
	switch {
	case s.id != id:
		s.mu.Unlock()
		d.unknown.Add(1)
		return false
	case s.st == nil:
		s.mu.Unlock()
		d.duplicate.Add(1)
		return false
	}
	st := s.st
	s.st = nil
	s.mu.Unlock()
	st.inflight.Add(-1)
	d.completed.Add(1)
	return true
}

// expire closes decisions older than ttl.
func (d *decisions) expire(now time.Time, ttl time.Duration) {
	cut := now.Add(-ttl).UnixNano()
	for i := range d.slots {
		s := &d.slots[i]
		s.mu.Lock()
		if s.st != nil && s.start < cut {
			s.st.inflight.Add(-1)
			s.st = nil
			d.expired.Add(1)
		}
		s.mu.Unlock()
	}
}
