package route

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/flow"
	"github.com/turnout/turnout/route/models"
)

// Ledger tracks in-flight decisions until the proxy reports completion or
// the TTL expires them. A fixed ring of slots indexed by id keeps the hot
// path allocation-free; an id that wraps onto a still-open slot expires the
// old decision (counted), so memory stays bounded under any load.
//
// An id is the slot's ring index in its low bits and random bits above, so
// a forged completion cannot close a live decision except by guessing
// 64-log2(slots) random bits (48 with the default 1<<16 slots).
type Ledger struct {
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
	// abandoned: closed at once, the caller gone (abandon.go).
	abandoned atomic.Uint64
	// pause notes when the process was not running (abandon.go).
	pause pauseWatch
	// openedAtClose is how many decisions had been opened at the last
	// completion (the feedback monitor's tick notes its time: no clock
	// read per completion).
	openedAtClose atomic.Uint64

	// reqlog is the request log's sink and sampling; nil: off.
	reqlog atomic.Pointer[requestLog]
	// tracer sees every finished decision (tracing.go); nil: off.
	tracer hook[Tracer]
	// fbStalled: route/feedback found completions stopped (SetFeedbackStalled).
	fbStalled atomic.Bool
	// low is the oldest sequence number that may still be open: every
	// older one was closed, expired or overwritten, so the sweep walks
	// only the slots from low to the newest (sweep). visited counts the
	// slots the sweeps walked.
	low     atomic.Uint64
	visited atomic.Uint64
}

// decisionSlot is one decision: open while st is set, then kept (closed
// or expired, with the proxy's completion) until the ring reuses the slot,
// for the request log and GET /internal/decision/<id>. Every field is fixed
// size (pointers into the snapshot, an index for the model), so opening
// and closing copy words and never allocate.
type decisionSlot struct {
	mu    sync.Mutex
	id    uint64
	seq   uint64 // the ledger's sequence number that last opened the slot
	start int64  // unix nanos
	// ep is the chosen endpoint; the decision holds one of its in-flight
	// counts while end is endOpen (a zero slot has none).
	ep     *fleet.Endpoint
	pool   *fleet.Pool
	names  *models.Table   // model indexes its Names
	served *fleet.Endpoint // srv of the feedback line: the fallback that answered, after a retry
	// model is an index into names.Names (-1: none).
	model, matched int32
	// The proxy's completion (-1: not sent).
	ms, ttfb, tft   int32
	status, retries int16
	outcome         fleet.Outcome
	session         bool
	end             decisionEnd
	pred            fleet.Prediction
	// notes are the policy's figures (fleet.Notes), named by pool.Policy.
	notes fleet.Notes
	// slo is the request's TTFT objective, counted at close.
	slo flow.SLOTicket
	// ident is the request's method, path and id; term how its stream
	// ended (the feedback line's).
	ident RequestIdent
	term  TermState
}

// decisionMeta is what a decision was, for its log line and lookup.
type decisionMeta struct {
	pool    *fleet.Pool
	names   *models.Table
	model   int32
	matched int32
	outcome fleet.Outcome
	session bool
	pred    fleet.Prediction
	notes   fleet.Notes
	slo     flow.SLOTicket
	// The request's method, URI and request id (views, copied at open).
	method, uri, rid []byte
}

// open reports the state the open decision counts in flight on, or nil.
func (s *decisionSlot) openState() *fleet.State {
	if s.end != endOpen || s.ep == nil {
		return nil
	}
	return s.ep.State
}

// decisionEnd is how a decision left the open state.
type decisionEnd uint8

const (
	endOpen decisionEnd = iota
	endClosed
	endExpired
)

func newDecisions(size int, seed uint64) *Ledger {
	n := 1
	for n < size {
		n <<= 1
	}
	d := &Ledger{slots: make([]decisionSlot, n), mask: uint64(n - 1)}
	d.first = seed &^ (1 << 63)
	d.next.Store(d.first)
	d.low.Store(d.first + 1)
	return d
}

// opened is the number of decisions opened so far.
func (d *Ledger) opened() uint64 { return d.next.Load() - d.first }

// mayHoldOpen reports whether any decision can still be open: more opened
// than closed in every way. An idle instance then skips the sweep's walk
// of the slots, otherwise its largest idle cost.
func (d *Ledger) mayHoldOpen() bool {
	_, open := d.newest()
	return open
}

// newest returns the newest sequence number and whether any decision up
// to it can still be open. The closes are read before the opens: a close
// is counted only after its open, so a race can only answer true.
func (d *Ledger) newest() (seq uint64, open bool) {
	closed := d.completed.Load() + d.expired.Load() + d.overwritten.Load() + d.reconciled.Load() + d.abandoned.Load()
	seq = d.next.Load()
	return seq, seq-d.first > closed
}

// open records a decision for e and returns its id. The random part comes
// from math/rand/v2's runtime source (ChaCha8 per thread, seeded by the OS):
// unpredictable, lock-free and allocation-free.
func (d *Ledger) open(e *fleet.Endpoint, now int64, m *decisionMeta) uint64 {
	seq := d.next.Add(1)
	id := rand.Uint64()&^d.mask | seq&d.mask
	s := &d.slots[seq&d.mask]
	s.mu.Lock()
	if st := s.openState(); st != nil {
		st.Inflight.Add(-1)
		st.Pending.Add(-int64(s.pred.Uncached))
		st.Expired.Add(1)
		d.overwritten.Add(1)
	}
	s.id, s.seq, s.start, s.ep, s.pool, s.names, s.served = id, seq, now, e, m.pool, m.names, nil
	s.model, s.matched, s.outcome, s.session, s.pred, s.notes = m.model, m.matched, m.outcome, m.session, m.pred, m.notes
	s.slo = m.slo
	s.end, s.status, s.retries, s.ms, s.ttfb, s.tft = endOpen, -1, -1, -1, -1, -1
	s.ident.Set(m.method, m.uri, m.rid)
	s.term = TermState{}
	s.mu.Unlock()
	e.State.Inflight.Add(1)
	if m.pred.Uncached != 0 {
		e.State.Pending.Add(int64(m.pred.Uncached))
	}
	e.State.Decisions.Add(1)
	return id
}

// close completes a decision; unknown and duplicate ids are counted and ignored.
func (d *Ledger) close(id uint64) bool {
	return d.closeState(id) != nil
}

// closeState completes a decision and returns the state of its endpoint (nil
// when the id is unknown or already completed).
func (d *Ledger) closeState(id uint64) *fleet.State {
	return d.closeWith(id, NoCompletion(), nil)
}

// closeWith completes a decision with the proxy's figures c; when rec is
// not nil it also receives the closed decision (the request log's line).
func (d *Ledger) closeWith(id uint64, c Completion, rec *DecisionRecord) *fleet.State {
	s := &d.slots[id&d.mask]
	s.mu.Lock()
	switch {
	case s.id != id:
		s.mu.Unlock()
		d.unknown.Add(1)
		return nil
	case s.openState() == nil:
		s.mu.Unlock()
		d.duplicate.Add(1)
		return nil
	}
	st, pool := s.ep.State, s.pool
	s.end = endClosed
	s.status, s.retries, s.ms, s.ttfb, s.served = clamp16(c.Status), clamp16(c.Retries), clamp32(c.Ms), clamp32(c.TTFB), c.Served
	s.tft = -1
	if c.HasFirstToken && c.FirstTokenMs >= 0 {
		s.tft = clamp32(c.FirstTokenMs)
	}
	s.term = c.Term
	if rec != nil {
		s.record(rec)
	}
	// A prediction is learned from when the chosen endpoint answered and
	// the proxy timed its first token.
	var learn fleet.TTFTLearner
	ep, pred := s.ep, s.pred
	if pred.TTFTMs > 0 && s.tft >= 0 && (c.Served == nil || c.Served == s.ep) && c.Retries <= 0 && s.pool != nil {
		learn, _ = s.pool.Policy.(fleet.TTFTLearner)
	}
	tft := int64(s.tft)
	slo, startNs := s.slo, s.start
	s.mu.Unlock()
	if learn != nil {
		learn.LearnTTFT(ep, pred, tft)
	}
	if slo.On() {
		slo.Observe(sloAt(&c, startNs))
	}
	st.Inflight.Add(-1)
	if pred.Uncached != 0 {
		st.Pending.Add(-int64(pred.Uncached))
	}
	d.completed.Add(1)
	d.openedAtClose.Store(d.opened())
	if pool != nil && pool.OnFree != nil {
		pool.OnFree()
	}
	return st
}

// sloAt is when a closed request's first token came, for its objective:
// the proxy's first-token time, else the response's end as the proxy
// timed it, else (a close without figures) the time since it opened.
func sloAt(c *Completion, startNs int64) int64 {
	switch {
	case c.HasFirstToken && c.FirstTokenMs >= 0:
		return c.FirstTokenMs
	case c.Ms >= 0:
		return c.Ms
	}
	return (time.Now().UnixNano() - startNs) / 1e6
}

// sweep closes decisions older than ttl and, with markStale, flags the
// endpoints that hold a decision open past half their stall limit with no
// request started since answered in time (see stall.go).
//
// An endpoint holding more such decisions than its engine last reported
// running + waiting is flagged too, whatever answered in time since: the
// engine cannot be serving them (a replica that stalls but still
// answers /health and /metrics reported 5-12 while turnout's open
// decisions on it grew from 13 to 1,445, and its few fast answers kept it
// in rotation for 124 s).
//
// It walks only the slots from the oldest decision that may be open to
// the newest (none when idle): the walk of all 65,536 slots every tick
// was an idle instance's largest cost and grew with the ring, not with
// what is open.
func (d *Ledger) sweep(now time.Time, ttl time.Duration, markStale bool) {
	hi, open := d.newest()
	if !open {
		if d.low.Load() != hi+1 {
			d.low.Store(hi + 1)
		}
		return
	}
	nowNs := now.UnixNano()
	cut := nowNs - int64(ttl)
	var old map[*fleet.State]int64 // decisions open past half the limit
	// Walk the sequence numbers from the oldest that may be open to the
	// newest, at most one ring: under load only the window of decisions
	// still open is walked, not every slot.
	lo := max(d.low.Load(), d.first+1)
	if n := uint64(len(d.slots)); hi >= lo && hi-lo >= n {
		lo = hi - n + 1 // older ones were overwritten
	}
	newLow := hi + 1
	for seq := lo; seq <= hi; seq++ {
		s := &d.slots[seq&d.mask]
		s.mu.Lock()
		switch {
		case s.seq < seq:
			// Opened (next moved) but not written yet: walk it next time.
			newLow = min(newLow, seq)
		case s.seq > seq:
			// Overwritten by a newer decision (counted at the overwrite).
		default:
			if st := s.openState(); st != nil {
				if s.start < cut {
					st.Inflight.Add(-1)
					st.Pending.Add(-int64(s.pred.Uncached))
					st.Expired.Add(1)
					s.end = endExpired
					d.expired.Add(1)
				} else {
					newLow = min(newLow, seq)
					if markStale {
						if b := st.Stall.Limit(); b > 0 && nowNs-s.start > b/2 {
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
			}
		}
		s.mu.Unlock()
	}
	if hi >= lo {
		d.visited.Add(hi - lo + 1)
	}
	d.low.Store(newLow)
	for st, n := range old {
		if running, ok := st.EngineRequests(); ok && n > running {
			st.Stall.Suspect.Store(true)
		}
	}
}

// clamp16 and clamp32 fit a feedback figure into its slot field (-1 stays
// unknown; a larger value saturates).
func clamp16(v int64) int16 { return int16(max(-1, min(v, 1<<15-1))) }
func clamp32(v int64) int32 { return int32(max(-1, min(v, 1<<31-1))) }

// reconcile closes the decisions opened before beforeNs whose completions
// a feedback outage lost (one left ~6,150 in flight with ~50 real, until
// decision_ttl). Per endpoint it keeps open the newest as many as the
// engine last reported running + waiting (none when no scrape is known:
// the requests still running then count again only as new ones come, and
// their own completions are counted as unknown), closing the oldest first.
// Load is kept as it was (fleet.State.Unmark). It returns how many closed.
func (d *Ledger) reconcile(beforeNs int64) uint64 {
	open := map[*fleet.State]int64{}
	for i := range d.slots {
		s := &d.slots[i]
		s.mu.Lock()
		if st := s.openState(); st != nil && s.start < beforeNs {
			open[st]++
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
		if st := s.openState(); st != nil && s.start < beforeNs && excess[st] > 0 {
			excess[st]--
			closed[st]++
			s.end = endExpired
			st.Inflight.Add(-1)
			st.Pending.Add(-int64(s.pred.Uncached))
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

// The request log's record: what the ledger (decisions.go) keeps of one
// decision, with the proxy's completion, and what a refusal was. One
// writer of its fields (DecisionRecord.Fields) serves the log line and
// GET /internal/decision/<id>, so both say the same thing.

// Completion is what the proxy's feedback line says about a finished
// request (-1: the line did not say).
type Completion struct {
	Status, Ms, TTFB int64
	// Retries is how many times the proxy retried the connection (HAProxy's
	// %rc, a redispatch to a fallback included).
	Retries int64
	// Served is the endpoint that answered (the line's srv), nil if unknown.
	Served *fleet.Endpoint
	// FirstTokenMs is the time to the replica's first response body bytes
	// (the line's tft=), meaningful only with HasFirstToken: a transport
	// that cannot time it leaves both unset.
	FirstTokenMs  int64
	HasFirstToken bool
	// Term is how the stream ended (the line's term; zero: not sent).
	Term TermState
}

// NoCompletion is a close without the proxy's figures (/internal/done).
func NoCompletion() Completion {
	return Completion{Status: -1, Ms: -1, TTFB: -1, Retries: -1}
}

// DecisionRecord is one request as the request log writes it. Its strings
// are the snapshot's own (no copies), except a refused request's model.
type DecisionRecord struct {
	// ID is the decision id (0: a refusal, no decision opened).
	ID                                uint64
	Deployment, Model, Endpoint, Pool string
	// Adapter: Model is a LoRA adapter (route/models).
	Adapter bool
	// Outcome is the policy's (balanced, affinity, overflow), or "refused".
	Outcome string
	// Reason is a refusal's reason code (X-Turnout-Reason).
	Reason        string
	MatchedBlocks int
	Session       bool
	Start         time.Time
	// State is open, closed or expired (expired: no feedback line came
	// within decision_ttl).
	State string
	// The completion (-1: unknown) and the endpoint that served it. TTFTMs
	// is the time to the first response body bytes, TTFBMs to the headers.
	Status, TTFBMs, TTFTMs, DurationMs, Retries int64
	ServedBy                                    string
	// Notes are the figures the deciding policy logs with the decision
	// (fleet.Notes), each a field of its own.
	Notes fleet.NoteList
	// Request is the request's method, path and request id.
	Request RequestIdent
	// Term is how the stream ended, as the proxy said (zero: unknown).
	Term TermState
}

// CutBy says who cut the stream short (contract.CutClient, CutReplica,
// CutProxy), "" when it ended normally or the proxy did not say.
func (r *DecisionRecord) CutBy() string { return contract.TermCutBy(r.Term.bytes()) }

// record copies the slot into r (the caller holds the slot's lock).
func (s *decisionSlot) record(r *DecisionRecord) {
	*r = DecisionRecord{
		ID: s.id, MatchedBlocks: int(s.matched), Session: s.session,
		Start: time.Unix(0, s.start), Outcome: s.outcome.String(),
		Status: int64(s.status), TTFBMs: int64(s.ttfb), TTFTMs: int64(s.tft), DurationMs: int64(s.ms), Retries: int64(s.retries),
		Request: s.ident, Term: s.term,
	}
	if s.ep != nil {
		r.Endpoint = s.ep.Name
	}
	if s.pool != nil {
		r.Pool, r.Deployment = s.pool.Name, s.pool.Deployment
		r.Notes = s.notes.Name(s.pool.Policy)
	}
	if s.names != nil && s.model >= 0 && int(s.model) < len(s.names.Names) {
		r.Model, r.Adapter = s.names.Names[s.model], s.names.IsAdapter(s.model)
	}
	if s.served != nil {
		r.ServedBy = s.served.Name
	}
	switch s.end {
	case endOpen:
		r.State = "open"
	case endClosed:
		r.State = "closed"
	default:
		r.State = "expired"
	}
}

// Fields writes the record's fields (docs/request-log.md names each) to e.
func (r *DecisionRecord) Fields(e *zerolog.Event) *zerolog.Event {
	if r.ID != 0 {
		var b [8]byte // the id's 16 hex digits, without a string
		binary.BigEndian.PutUint64(b[:], r.ID)
		e = e.Hex("decision", b[:])
	}
	if m := r.Request.Method(); len(m) > 0 {
		e = e.Bytes("method", m)
	}
	if p := r.Request.Path(); len(p) > 0 {
		e = e.Bytes("path", p)
	}
	if id := r.Request.RequestID(); len(id) > 0 {
		e = e.Bytes("request_id", id)
	}
	e = e.Str("deployment", r.Deployment).Str("model", r.Model).
		Str("endpoint", r.Endpoint).Str("pool", r.Pool).
		Str("outcome", r.Outcome)
	if r.Reason != "" {
		e = e.Str("reason", r.Reason)
	}
	if r.Adapter {
		e = e.Bool("adapter", true)
	}
	e = e.Int("matched_blocks", r.MatchedBlocks).Bool("session", r.Session).
		Int64("status", r.Status).Int64("ttfb_ms", r.TTFBMs).Int64("ttft_ms", r.TTFTMs).Int64("duration_ms", r.DurationMs).
		Int64("retries", r.Retries).Str("served_by", r.ServedBy).Str("state", r.State)
	if r.Term.known() {
		e = e.Bytes("term", r.Term.bytes())
		if cut := r.CutBy(); cut != "" {
			e = e.Str("cut", cut)
		}
	}
	for _, n := range r.Notes.List[:r.Notes.N] {
		e = e.Float64(n.Key, n.Value)
	}
	if !r.Start.IsZero() {
		e = e.Time("start", r.Start)
	}
	return e
}

// RequestSink receives the sampled records: completed requests (from the
// feedback loop's goroutine) and refusals (from the decision's). It may
// block briefly (a write); it must not keep r.
type RequestSink interface {
	Request(r *DecisionRecord)
}

// requestLog is the installed sink and its sample threshold.
type requestLog struct {
	sink RequestSink
	// below: a decision is logged when mix(id) < below (rate * 2^64).
	below uint64
	all   bool
	// recs holds records between lines: handed to the sink (an interface)
	// a record escapes, so a fresh one per line was an allocation.
	recs sync.Pool
}

// record takes a record for one line; put gives it back once the sink,
// which must not keep it, has written it.
func (l *requestLog) record() *DecisionRecord {
	if r, _ := l.recs.Get().(*DecisionRecord); r != nil {
		return r
	}
	return new(DecisionRecord)
}

func (l *requestLog) put(r *DecisionRecord) { l.recs.Put(r) }

// sampled decides from the id alone (ids are random above the ring bits;
// the multiply spreads them), so the choice costs a multiply.
func (l *requestLog) sampled(id uint64) bool {
	if l.all {
		return true
	}
	return id*0x9e3779b97f4a7c15 < l.below
}

// SetRequestSink installs (nil: removes) the request log at sample rate
// (0..1].
func (d *Ledger) SetRequestSink(sink RequestSink, rate float64) {
	if sink == nil || rate <= 0 {
		d.reqlog.Store(nil)
		return
	}
	l := &requestLog{sink: sink, all: rate >= 1}
	if !l.all {
		l.below = uint64(rate * (1 << 63) * 2)
	}
	d.reqlog.Store(l)
}

// CloseDecisionWith completes a decision with the proxy's figures (the
// feedback line) and returns the state of its endpoint (nil when the id is
// unknown or already completed). A sampled decision goes to the request log.
func (d *Ledger) CloseDecisionWith(id uint64, c Completion) *fleet.State {
	l := d.reqlog.Load()
	if l == nil || !l.sampled(id) {
		return d.closeWith(id, c, nil)
	}
	r := l.record()
	st := d.closeWith(id, c, r)
	if st != nil {
		l.sink.Request(r)
	}
	l.put(r)
	return st
}

// Complete closes a decision by id (feedback from the proxy).
// A sampled one goes to the request log, without the proxy's figures.
func (d *Ledger) Complete(id uint64) bool { return d.CloseDecisionWith(id, NoCompletion()) != nil }

// SetFeedbackStalled tells the ledger whether completions stopped arriving
// (route/feedback): a decision open for long then proves nothing about its
// endpoint.
func (d *Ledger) SetFeedbackStalled(stalled bool) { d.fbStalled.Store(stalled) }

// CloseDecision completes a decision by id and returns the state of its
// endpoint (nil when the id is unknown or already completed).
func (d *Ledger) CloseDecision(id uint64) *fleet.State { return d.closeState(id) }

// Reconcile closes the decisions opened before 'before' that a
// feedback outage left open, keeping per endpoint as many as its engine
// last reported (route/feedback calls it when completions arrive again);
// it returns how many it closed.
func (d *Ledger) Reconcile(before time.Time) uint64 {
	return d.reconcile(before.UnixNano())
}

// Counts are the decisions opened and completed so far, and how many
// had been opened at the last completion.
func (d *Ledger) Counts() (opened, completed, openedAtClose uint64) {
	return d.opened(), d.completed.Load(), d.openedAtClose.Load()
}

// lookupWindow bounds how old a decision GET /internal/decision/<id> still
// finds: recent enough to explain a slow request, short enough that an id
// does not become a lasting handle (the ring bounds it by count too).
const lookupWindow = 15 * time.Minute

// LookupDecision fills r with a recent decision (open, or started within
// the last 15 minutes and still in the ledger's ring); false when unknown.
func (d *Ledger) LookupDecision(id uint64, now time.Time, r *DecisionRecord) bool {
	sl := &d.slots[id&d.mask]
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.id != id || sl.ep == nil || (sl.end != endOpen && now.UnixNano()-sl.start > int64(lookupWindow)) {
		return false
	}
	sl.record(r)
	return true
}

// logRefusal writes a sampled refusal: the request had no decision, so
// what it had is the deployment (if the model named one), the model as
// sent, and the reason (a refusal allocates anyway: its error body).
func (d *Ledger) logRefusal(sc *Txn, v *contract.Verdict, start time.Time) {
	l := d.reqlog.Load()
	if l == nil || !l.sampled(rand.Uint64()) {
		return
	}
	r := DecisionRecord{
		Model: string(cut(sc.req.Model, maxEchoModel)), Outcome: "refused", Reason: v.Reason,
		Session: sc.req.HasSession || len(sc.req.Session) > 0, Status: int64(v.Status),
		TTFBMs: -1, TTFTMs: -1, DurationMs: -1, Retries: -1, State: "refused", Start: start,
	}
	if sc.dep != nil {
		r.Deployment = sc.dep.Name
	}
	if sc.refusedPool != nil {
		r.Pool = sc.refusedPool.Name
	}
	r.Request.Set(sc.method, sc.uri, sc.rid)
	l.sink.Request(&r)
}
