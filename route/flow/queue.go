package flow

import "time"

// waiter is one held request; pooled with its channel.
type waiter struct {
	ch    chan struct{} // one send: released
	class int
	at    time.Time
	state waiterState
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
}

// classQueue is one class: a FIFO per tenant, and the tenants with
// requests held in the order they take turns (round robin: a tenant
// sending ten times more gets no more turns than the others).
type classQueue struct {
	tenants map[uint64]*tenantQueue
	active  []*tenantQueue
	turn    int // index into active of the tenant whose turn is next
	n       int
}

func (q *classQueue) push(w *waiter, tenant uint64) {
	t := q.tenants[tenant]
	if t == nil {
		t = &tenantQueue{key: tenant}
		q.tenants[tenant] = t
	}
	if t.n == 0 {
		// A tenant with nothing held joins the round just before the one
		// whose turn is next: it waits a full round, as if it had been
		// there all along, and cannot jump ahead by leaving and returning.
		q.active = append(q.active, nil)
		copy(q.active[q.turn+1:], q.active[q.turn:])
		q.active[q.turn] = t
		q.turn++
		if q.turn >= len(q.active) {
			q.turn = 0
		}
	}
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

// pop takes the oldest request of the tenant whose turn it is.
func (q *classQueue) pop() *waiter {
	if q.n == 0 {
		return nil
	}
	if q.turn >= len(q.active) {
		q.turn = 0
	}
	t := q.active[q.turn]
	w := t.head
	q.unlink(w)
	if t.n > 0 {
		q.turn++ // the next tenant's turn; an emptied one left the round
	}
	if q.turn >= len(q.active) {
		q.turn = 0
	}
	return w
}

// remove takes w out wherever it is (its budget ended, its client left).
func (q *classQueue) remove(w *waiter) { q.unlink(w) }

// unlink removes w from its tenant's FIFO, and an emptied tenant from the
// round (its entry in tenants goes too: the map stays as large as the
// tenants that have something held).
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
	delete(q.tenants, t.key)
	for i, a := range q.active {
		if a == t {
			q.active = append(q.active[:i], q.active[i+1:]...)
			if i < q.turn {
				q.turn--
			}
			break
		}
	}
}
