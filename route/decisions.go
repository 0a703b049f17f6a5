package route

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/route/fleet"
)

// decisions tracks in-flight decisions until the proxy reports completion or
// the TTL expires them. A fixed ring of slots indexed by id keeps the hot
// path allocation-free; an id that wraps onto a still-open slot expires the
// old decision (counted), so memory stays bounded under any load.
//
// An id is the slot's ring index in its low bits and random bits above, so
// a forged completion cannot close a live decision except by guessing
// 64-log2(slots) random bits (48 with the default 1<<16 slots).
type decisions struct {
	slots []decisionSlot
	mask  uint64
	next  atomic.Uint64
	first uint64 // next's start value: next-first is the number opened

	completed   atomic.Uint64
	unknown     atomic.Uint64
	duplicate   atomic.Uint64
	expired     atomic.Uint64
	overwritten atomic.Uint64
	// reconciled: closed when feedback came back after a gap (reconcile).
	reconciled atomic.Uint64
	// openedAtClose is how many decisions had been opened at the last
	// completion (the feedback monitor's tick notes its time: no clock
	// read per completion).
	openedAtClose atomic.Uint64
}

type decisionSlot struct {
	mu    sync.Mutex
	id    uint64
	st    *fleet.State
	start int64 // unix nanos
}

func newDecisions(size int, seed uint64) *decisions {
	n := 1
	for n < size {
		n <<= 1
	}
	d := &decisions{slots: make([]decisionSlot, n), mask: uint64(n - 1)}
	d.first = seed &^ (1 << 63)
	d.next.Store(d.first)
	return d
}

// opened is the number of decisions opened so far.
func (d *decisions) opened() uint64 { return d.next.Load() - d.first }

// open records a decision for e and returns its id. The random part comes
// from math/rand/v2's runtime source (ChaCha8 per thread, seeded by the OS):
// unpredictable, lock-free and allocation-free.
func (d *decisions) open(e *fleet.Endpoint, now int64) uint64 {
	seq := d.next.Add(1)
	id := rand.Uint64()&^d.mask | seq&d.mask
	s := &d.slots[seq&d.mask]
	s.mu.Lock()
	if s.st != nil {
		s.st.Inflight.Add(-1)
		s.st.Expired.Add(1)
		d.overwritten.Add(1)
	}
	s.id, s.st, s.start = id, e.State, now
	s.mu.Unlock()
	e.State.Inflight.Add(1)
	e.State.Decisions.Add(1)
	return id
}

// close completes a decision; unknown and duplicate ids are counted and ignored.
func (d *decisions) close(id uint64) bool {
	return d.closeState(id) != nil
}

// closeState completes a decision and returns the state of its endpoint (nil
// when the id is unknown or already completed).
func (d *decisions) closeState(id uint64) *fleet.State {
	s := &d.slots[id&d.mask]
	s.mu.Lock()
	switch {
	case s.id != id:
		s.mu.Unlock()
		d.unknown.Add(1)
		return nil
	case s.st == nil:
		s.mu.Unlock()
		d.duplicate.Add(1)
		return nil
	}
	st := s.st
	s.st = nil
	s.mu.Unlock()
	st.Inflight.Add(-1)
	d.completed.Add(1)
	d.openedAtClose.Store(d.opened())
	return st
}

// sweep closes decisions older than ttl and, with markStale, flags the
// endpoints that hold a decision open past half their stall budget with no
// request started since answered in time (see stall.go).
//
// An endpoint holding more such decisions than its engine last reported
// running + waiting is flagged too, whatever answered in time since: the
// engine cannot be serving them (issue 28: a replica that stalls but still
// answers /health and /metrics reported 5-12 while turnout's open
// decisions on it grew from 13 to 1,445, and its few fast answers kept it
// in rotation for 124 s).
func (d *decisions) sweep(now time.Time, ttl time.Duration, markStale bool) {
	nowNs := now.UnixNano()
	cut := nowNs - int64(ttl)
	var old map[*fleet.State]int64 // decisions open past half the budget
	for i := range d.slots {
		s := &d.slots[i]
		s.mu.Lock()
		if st := s.st; st != nil {
			if s.start < cut {
				st.Inflight.Add(-1)
				st.Expired.Add(1)
				s.st = nil
				d.expired.Add(1)
			} else if markStale {
				if b := st.Stall.BudgetNs.Load(); b > 0 && nowNs-s.start > b/2 {
					if st.Stall.FastStart.Load() < s.start {
						st.Stall.Suspect.Store(true)
					}
					if old == nil {
						old = map[*fleet.State]int64{}
					}
					old[st]++
				}
			}
		}
		s.mu.Unlock()
	}
	for st, n := range old {
		if running, ok := st.EngineRequests(); ok && n > running {
			st.Stall.Suspect.Store(true)
		}
	}
}

// appendID writes a decision id as 16 hex digits, 8 at a time (hex8): a
// loop over digits cost ~160 instructions per decision, an append per
// digit ~250.
func appendID(dst []byte, id uint64) []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hex8(uint32(id>>32)))
	binary.BigEndian.PutUint64(b[8:], hex8(uint32(id)))
	return append(dst, b[:]...)
}

// hex8 returns the 8 lower-case hex digits of v as the bytes of a word,
// the first digit in the top byte: each nibble is spread to a byte, then
// '0' is added, and 'a'-'0'-10 more where the nibble is >= 10 (n+6 carries
// into bit 4 exactly then; no byte overflows into the next).
func hex8(v uint32) uint64 {
	x := uint64(v)
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	x = (x | x<<4) & 0x0f0f0f0f0f0f0f0f
	letters := (x + 0x0606060606060606) >> 4 & 0x0101010101010101
	return x + 0x3030303030303030 + letters*('a'-'0'-10)
}

// ParseDecisionID reads a decision id as the proxy sends it back
// (Verdict.DecisionHex).
func ParseDecisionID(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b), 16, 64)
	return v, err == nil
}

// reconcile closes the decisions opened before beforeNs whose completions
// a feedback outage lost (issue 28: ~6,150 in flight with ~50 real, until
// decision_ttl). Per endpoint it keeps open the newest as many as the
// engine last reported running + waiting (none when no scrape is known:
// the requests still running then count again only as new ones come, and
// their own completions are counted as unknown), closing the oldest first.
// Load is kept as it was (fleet.State.Unmark). It returns how many closed.
func (d *decisions) reconcile(beforeNs int64) uint64 {
	open := map[*fleet.State]int64{}
	for i := range d.slots {
		s := &d.slots[i]
		s.mu.Lock()
		if s.st != nil && s.start < beforeNs {
			open[s.st]++
		}
		s.mu.Unlock()
	}
	excess := map[*fleet.State]int64{}
	for st, n := range open {
		keep, _ := st.EngineRequests()
		if n > keep {
			excess[st] = n - keep
		}
	}
	if len(excess) == 0 {
		return 0
	}
	closed := map[*fleet.State]int64{}
	var total uint64
	// Ring order from the oldest sequence number: oldest decisions first.
	first := d.next.Load() + 1
	for j := range uint64(len(d.slots)) {
		s := &d.slots[(first+j)&d.mask]
		s.mu.Lock()
		if st := s.st; st != nil && s.start < beforeNs && excess[st] > 0 {
			excess[st]--
			closed[st]++
			s.st = nil
			st.Inflight.Add(-1)
			st.Expired.Add(1)
			total++
		}
		s.mu.Unlock()
	}
	for st, n := range closed {
		st.Unmark(n)
	}
	d.reconciled.Add(total)
	return total
}
