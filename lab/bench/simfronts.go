package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/turnout/turnout/route/cluster"
	"github.com/turnout/turnout/route/fleet"
)

// frontsRouter models N turnout instances before the same replicas in the
// sim (`bench replay --mode sim --fronts`): a request goes through the
// front FrontOf gives it (--split), each front is its own route.Decider (own ledger, index and
// seed), and what the cluster sync carries reaches the other fronts
// 0.5-1.5x SyncDelay of virtual time later (uniform, drawn from the seed,
// in order per sender as NATS keeps it): a prefix decision's blocks and count
// (route/cluster's apply) and the front's in-flight change (its load
// messages, which move peers' Endpoint.Load until their next scrape). The
// e2e replay measures the same through NATS, with the box's noise; the
// sim isolates what the delay costs.
//
// Every message also goes through route/cluster's wire format: encoded
// once by its sender (a decision as a batch of one record and the
// front's load message, a completion as a load message: what a Sync whose
// publisher finds one decision queued sends), decoded by each other front,
// whose decision records are applied from the decoded bytes. The time of
// that (encode, decode, apply) is the sync's CPU the fronts table reports,
// read from the thread's CPU clock (the sim holds its thread).
type frontsRouter struct {
	fronts []*turnoutRouter
	// syncs: the pool's policy records prefixes, so the cluster syncs it
	// (others share nothing).
	syncs bool
	delay time.Duration
	now   time.Duration
	// front is each request's front, by Request.Index (FrontOf).
	front []int
	// due holds the sync's messages in flight, by arrival time.
	due []syncMsg
	// last is each front's latest arrival time: a sender's messages
	// arrive in order.
	last []time.Duration
	rnd  *fleet.Rand
	// open maps the sim's token to the front and decision it stands for.
	open map[uint64]frontDecision
	tok  uint64
	// sharedScrapes: each replica's engine figures come from one front
	// (SimOptions.SharedScrapes).
	sharedScrapes bool
	// sunk is the last decision's prompt blocks (a front's prefix sink),
	// copied: the sink's view is per-request scratch; shared is whether
	// the sink was called at all (the cluster publishes that decision).
	sunk   []uint64
	shared bool
	// The sync's cost: messages and bytes sent, the time spent encoding,
	// decoding and applying, and the decoder's scratch.
	msgs, bytes int64
	cost        time.Duration
	buf         []uint64
	// clock is what reading the thread clock twice adds to an interval,
	// taken off each one.
	clock time.Duration
}

type frontDecision struct {
	front, replica int
	id             uint64
}

// syncMsg is what one front's decision (load +1, with its blocks) or
// completion (load -1) tells the others.
type syncMsg struct {
	at             time.Duration
	front, replica int
	load           int64
	blocks         []uint64
	shared         bool // a decision the front published
	// wire: the decision's batch (when shared) and the sender's load
	// message, in route/cluster's format.
	wire, loads []byte
	// report: the owner's engine figures (SharedScrapes), not a decision.
	report           bool
	running, waiting int
}

// frontSink is one front's prefix sink: it keeps the decision's blocks for
// the router to send.
type frontSink struct{ r *frontsRouter }

func (s frontSink) RoutedPrefix(_ *fleet.Pool, _ *fleet.Endpoint, blocks []uint64) {
	s.r.sunk = append(s.r.sunk[:0], blocks...)
	s.r.shared = true
}

func newFrontsRouter(spec PolicySpec, names []string, o SimOptions, n int, front []int) (*frontsRouter, error) {
	fr := &frontsRouter{front: front, delay: o.SyncDelay, sharedScrapes: o.SharedScrapes, open: map[uint64]frontDecision{}, last: make([]time.Duration, n), rnd: fleet.NewRand(o.Seed)}
	for f := range n {
		fo := o
		fo.Seed = o.Seed + uint64(f) // instances do not share a random stream
		r, err := NewRouter(spec, names, fo)
		if err != nil {
			_ = fr.Close()
			return nil, err
		}
		t, ok := r.(*turnoutRouter)
		if !ok {
			_ = fr.Close()
			return nil, fmt.Errorf("--fronts: %s is not a turnout policy", spec)
		}
		t.srv.SetPrefixSink(frontSink{fr})
		fr.fronts = append(fr.fronts, t)
	}
	_, fr.syncs = fr.fronts[0].srv.Snapshot().Deployments[0].Serve.Policy.(fleet.PrefixRecorder)
	fr.clock = clockCost()
	return fr, nil
}

// SetNow implements Clocked: messages due by now reach the other fronts
// before the next decision or completion.
func (fr *frontsRouter) SetNow(t time.Duration) {
	fr.now = t
	k := 0
	for ; k < len(fr.due) && fr.due[k].at <= t; k++ {
		fr.deliver(&fr.due[k])
	}
	if k > 0 {
		fr.due = append(fr.due[:0], fr.due[k:]...)
	}
}

func (fr *frontsRouter) deliver(m *syncMsg) {
	start := threadCPU()
	defer func() { fr.cost += max(0, threadCPU()-start-fr.clock) }()
	for g, t := range fr.fronts {
		if g == m.front {
			continue
		}
		if m.report {
			t.ReportEngine(m.replica, m.running, m.waiting)
			continue
		}
		e := t.endpoint(m.replica)
		if e == nil {
			continue
		}
		p := t.srv.Snapshot().Deployments[0].Serve
		var err error
		if m.shared {
			rec, _ := p.Policy.(fleet.PrefixRecorder)
			fr.buf, err = cluster.DecodeMessage(m.wire, fr.buf, func(ep []byte, blocks []uint64) {
				pe := p.EndpointByName(ep)
				if pe == nil {
					return
				}
				if rec != nil && len(blocks) > 0 {
					rec.RecordPrefix(pe.Index, blocks)
				}
				pe.NotePeerDecision()
			}, nil)
		}
		// The levels are decoded as a Sync would; the sim moves the peer
		// load by the message's change (the same once in order).
		if err == nil {
			fr.buf, err = cluster.DecodeMessage(m.loads, fr.buf, nil, func([]byte, int64) {})
		}
		if err != nil {
			panic(fmt.Sprintf("sim fronts: a message the sim encoded does not decode: %v", err))
		}
		e.AddPeerLoad(m.load)
	}
}

// encode writes m's messages as front m.front's Sync would send them.
func (fr *frontsRouter) encode(m *syncMsg) {
	if m.report {
		return // engine figures ride their own subject; not a decision's sync
	}
	start := threadCPU()
	t := fr.fronts[m.front]
	p := t.srv.Snapshot().Deployments[0].Serve
	origin := "front-" + strconv.Itoa(m.front)
	if e := t.endpoint(m.replica); e != nil && m.shared {
		m.wire = cluster.AppendDecisionMessage(nil, origin, p, e, m.blocks)
		fr.msgs++
		fr.bytes += int64(len(m.wire))
	}
	m.loads = cluster.AppendLoadMessage(nil, origin, p)
	fr.msgs++
	fr.bytes += int64(len(m.loads))
	fr.cost += max(0, threadCPU()-start-fr.clock)
}

// clockCost is the least of some intervals between two thread-clock
// readings with nothing between them.
func clockCost() time.Duration {
	least := time.Duration(1<<63 - 1)
	for range 1000 {
		s := threadCPU()
		least = min(least, threadCPU()-s)
	}
	return least
}

// SyncCost is what the sync cost over the run: messages and bytes sent,
// and the time spent encoding, decoding and applying them (all fronts).
func (fr *frontsRouter) SyncCost() (msgs, bytes int64, cost time.Duration) {
	return fr.msgs, fr.bytes, fr.cost
}

func (fr *frontsRouter) send(m syncMsg) {
	if !fr.syncs && !m.report {
		return
	}
	fr.encode(&m)
	if fr.delay <= 0 {
		fr.deliver(&m)
		return
	}
	jitter := time.Duration(fr.rnd.Uint64() % uint64(fr.delay+1))
	m.at = max(fr.now+fr.delay/2+jitter, fr.last[m.front])
	fr.last[m.front] = m.at
	i := len(fr.due)
	fr.due = append(fr.due, m)
	for ; i > 0 && fr.due[i-1].at > m.at; i-- {
		fr.due[i] = fr.due[i-1]
	}
	fr.due[i] = m
}

func (fr *frontsRouter) NeedsBody() bool { return true }

func (fr *frontsRouter) Route(r *Request, body []byte) (int, uint64, error) {
	if r.Index < 0 || r.Index >= len(fr.front) {
		return 0, 0, fmt.Errorf("sim fronts: request %d has no front", r.Index)
	}
	f := fr.front[r.Index]
	fr.sunk, fr.shared = fr.sunk[:0], false
	i, id, err := fr.fronts[f].Route(r, body)
	if err != nil {
		return 0, 0, err
	}
	fr.tok++
	fr.open[fr.tok] = frontDecision{front: f, replica: i, id: id}
	m := syncMsg{front: f, replica: i, load: 1, shared: fr.shared}
	if len(fr.sunk) > 0 {
		m.blocks = append([]uint64(nil), fr.sunk...)
	}
	fr.send(m)
	return i, fr.tok, nil
}

func (fr *frontsRouter) take(tok uint64) (frontDecision, error) {
	d, ok := fr.open[tok]
	if !ok {
		return d, fmt.Errorf("token %d was not open", tok)
	}
	delete(fr.open, tok)
	fr.send(syncMsg{front: d.front, replica: d.replica, load: -1})
	return d, nil
}

func (fr *frontsRouter) Done(tok uint64) error {
	d, err := fr.take(tok)
	if err != nil {
		return err
	}
	return fr.fronts[d.front].Done(d.id)
}

// DoneTTFB implements TTFBReporter.
func (fr *frontsRouter) DoneTTFB(tok uint64, ttfb, firstToken, total time.Duration) error {
	d, err := fr.take(tok)
	if err != nil {
		return err
	}
	return fr.fronts[d.front].DoneTTFB(d.id, ttfb, firstToken, total)
}

// StartWindow implements Windower: every front scrapes at the same instants.
func (fr *frontsRouter) StartWindow() {
	for _, t := range fr.fronts {
		t.StartWindow()
	}
}

// ReportEngine implements EngineReporter: each front marks the scrape
// against its own in-flight and peer counts. With shared scrapes only the
// replica's owner reads it now; the others get its figures through the
// sync, later.
func (fr *frontsRouter) ReportEngine(replica, running, waiting int) {
	if !fr.sharedScrapes || len(fr.fronts) == 1 {
		for _, t := range fr.fronts {
			t.ReportEngine(replica, running, waiting)
		}
		return
	}
	owner := replica % len(fr.fronts)
	fr.fronts[owner].ReportEngine(replica, running, waiting)
	fr.send(syncMsg{front: owner, replica: replica, report: true, running: running, waiting: waiting})
}

// Detail sums the fronts' decision outcomes, as the e2e fronts row does.
func (fr *frontsRouter) Detail() string {
	var b strings.Builder
	for _, t := range fr.fronts {
		t.srv.WriteMetrics(&b)
		b.WriteByte('\n')
	}
	return DecisionDetail(b.String())
}

func (fr *frontsRouter) Close() error {
	var first error
	for _, t := range fr.fronts {
		if err := t.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

var (
	_ Router         = (*frontsRouter)(nil)
	_ Clocked        = (*frontsRouter)(nil)
	_ TTFBReporter   = (*frontsRouter)(nil)
	_ Windower       = (*frontsRouter)(nil)
	_ EngineReporter = (*frontsRouter)(nil)
)
