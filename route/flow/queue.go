package flow

import "time"

// waiter is one held request; pooled with its channel.
type waiter struct {
	ch    chan struct{} // one send: released
	class int
	at    time.Time
	state waiterState
	// tag is its start tag in its class's virtual time, seq its place in
	// arrival order (classQueue).
	tag, seq uint64
	// The tenant's FIFO.
	tenant     *tenantQueue
	prev, next *waiter
}

type waiterState uint8

const (
	stateQueued waiterState = iota
	stateReleased
)

// tenantQueue is one tenant's held requests in one class, oldest first.
type tenantQueue struct {
	key        uint64
	head, tail *waiter
	n          int
	// finish is the start tag its next request gets at the earliest: one
	// past its last one's.
	finish uint64
}

// classQueue is one class: a FIFO per tenant, released by start-time fair
// queueing with one request as the unit. Each held request gets a start
// tag, the later of the class's virtual time (the tag of the last request
// released) and one past its tenant's previous tag; the smallest tag goes
// first, the earlier arrival among equal ones. A tenant sending ten times
// more gets no more releases than the others (its tags run ahead); one
// that had nothing held goes before the tenants already served at the
// virtual time, so it waits about one release, not a whole round; and
// leaving and returning buys nothing, since an emptied tenant's finish tag
// is kept while it is ahead of the virtual time.
type classQueue struct {
	// tenants holds the tenants with requests held, and the emptied ones
	// whose finish tag is still ahead of vt (pruned as vt passes them).
	tenants map[uint64]*tenantQueue
	// active are the tenants with requests held.
	active []*tenantQueue
	n      int
	vt     uint64
	seq    uint64
	// idle counts the emptied tenants kept in tenants; past pruneAt they
	// are pruned.
	idle, pruneAt int
}

// maxIdle bounds the emptied tenants kept: tenants of one request each,
// all served at the same virtual time, are never caught up with.
const maxIdle = 1024

func (q *classQueue) push(w *waiter, tenant uint64) {
	t := q.tenants[tenant]
	if t == nil {
		t = &tenantQueue{key: tenant}
		q.tenants[tenant] = t
	} else if t.n == 0 {
		q.idle--
	}
	if t.n == 0 {
		q.active = append(q.active, t)
	}
	w.tag, w.seq = max(q.vt, t.finish), q.seq
	q.seq++
	t.finish = w.tag + 1
	w.tenant, w.prev, w.next = t, t.tail, nil
	if t.tail != nil {
		t.tail.next = w
	} else {
		t.head = w
	}
	t.tail = w
	t.n++
	q.n++
}

// pop takes the held request with the smallest start tag, the earliest
// among equal ones.
func (q *classQueue) pop() *waiter {
	if q.n == 0 {
		return nil
	}
	var w *waiter
	for _, t := range q.active {
		if h := t.head; w == nil || h.tag < w.tag || h.tag == w.tag && h.seq < w.seq {
			w = h
		}
	}
	q.vt = max(q.vt, w.tag)
	q.unlink(w)
	return w
}

// remove takes w out wherever it is (its budget ended, its client left).
func (q *classQueue) remove(w *waiter) { q.unlink(w) }

// unlink removes w from its tenant's FIFO, and an emptied tenant from
// active; its entry in tenants stays only while its finish tag is ahead of
// the virtual time (the map stays about as large as the tenants held).
func (q *classQueue) unlink(w *waiter) {
	t := w.tenant
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		t.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		t.tail = w.prev
	}
	w.prev, w.next, w.tenant = nil, nil, nil
	t.n--
	q.n--
	if t.n > 0 {
		return
	}
	for i, a := range q.active {
		if a == t {
			q.active = append(q.active[:i], q.active[i+1:]...)
			break
		}
	}
	if t.finish <= q.vt {
		delete(q.tenants, t.key)
		return
	}
	q.idle++
	if q.idle > max(q.pruneAt, 16+len(q.active)) {
		q.prune()
	}
}

// prune drops the emptied tenants the virtual time has caught up with,
// and all of them past maxIdle.
func (q *classQueue) prune() {
	all := q.idle > maxIdle
	for k, t := range q.tenants {
		if t.n == 0 && (all || t.finish <= q.vt) {
			delete(q.tenants, k)
			q.idle--
		}
	}
	q.pruneAt = min(2*q.idle, maxIdle)
}
