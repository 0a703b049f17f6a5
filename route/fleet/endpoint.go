package fleet

import (
	"sync/atomic"

	"github.com/turnout/turnout/internal/kvtopic"
)

// State is the part of an endpoint that survives config reloads, shared by
// the layers above: the decision ledger (route) moves Inflight, Decisions
// and Expired, health checks Down, Fails, Checked and SeenUp, completion
// feedback Feedback and Stall. Policies read it through Endpoint's methods.
// It must not be copied (atomics).
type State struct {
	Inflight atomic.Int64
	// Pending is the uncached prompt bytes of the open decisions that
	// carry a prediction (fleet.Prediction.Uncached): prefill work queued
	// at the endpoint by this instance.
	Pending   atomic.Int64
	Down      atomic.Bool
	Fails     atomic.Int32
	Decisions atomic.Uint64
	// engine is the last engine-reported load (nil: none, use inflight).
	engine atomic.Pointer[EngineLoad]
	// running is how many requests the engine ran at once the last time a
	// scrape found it queueing (0: never seen queueing): its capacity.
	running atomic.Int64
	// window is 1 + decisions + peer at the last window start (0: none),
	// prevWindow the same at the window start before it.
	window, prevWindow atomic.Uint64
	// peer counts other instances' decisions for this endpoint (cluster
	// sync); peerLoad is the sum of their last reported in-flight counts.
	peer     atomic.Uint64
	peerLoad atomic.Int64
	// Checked: a health check has judged it; seenUp: one has passed.
	Checked, SeenUp atomic.Bool
	// UpAt is when a health check first passed (unix ns, 0: never): the
	// wait for its first model list counts from there (ModelsPending).
	UpAt atomic.Int64
	// Completion feedback and stall detection (route/feedback).
	Expired  atomic.Uint64 // decisions closed by TTL or ring wrap, never completed
	Feedback Feedback
	Stall    StallState
	// models: what the endpoint serves and its LoRA slots (models.go).
	models modelState
}

// Endpoint is one replica inside an immutable pool snapshot.
type Endpoint struct {
	Name    string
	Address string
	// KVEvents is the replica's KV-event publisher address ("" = none).
	KVEvents, KVTopic, KVReplay string
	// KVBind is the bound SUB address feeding this replica's events (bind
	// mode, "" = none) and KVPattern the topic that identifies them.
	KVBind    string
	KVPattern kvtopic.Pattern

	// Draining endpoints get no new decisions (terminating pods).
	Draining bool
	Index    int    // position in the pool
	Seed     uint64 // per-endpoint hash seed, fixed by name
	// NameHdr and AddrHdr are Name and Address pre-built as header values:
	// no conversion on the hot path.
	NameHdr, AddrHdr []byte
	// State survives reloads (the snapshot builder carries it over).
	State *State
}

// PendingBytes is the uncached prompt bytes of this instance's open
// predicted decisions on the endpoint (State.Pending).
func (e *Endpoint) PendingBytes() int64 { return e.State.Pending.Load() }

// Inflight is the number of decisions sent to this endpoint not yet completed.
func (e *Endpoint) Inflight() int64 { return e.State.Inflight.Load() }

// Load is the figure every policy balances on: the engine's own count of
// running + waiting requests at the last scrape, moved by this instance's
// in-flight change since that scrape (decisions opened minus completed: a
// burst between scrapes is seen at once, and a finished request stops
// counting) and by its peers' (cluster sync: each front publishes its
// in-flight counts with its decisions, so every front sees the others'
// burst too rather than herding onto the replica that looks least loaded
// to each alone until the next scrape), or the in-flight count when no
// engine figure is known (scraping off or failing). Counting the change
// rather than the level keeps a lost completion, or a peer gone silent,
// from skewing the figure beyond two scrapes. It is never below this
// instance's in-flight count less the decisions two scrapes in a row did
// not find on the engine (EngineLoad.Ghosts): a request on its way to the
// engine when the page was built, or one that finished there before it
// and whose completion came after, is missing from one page only, and
// counting it as gone let flow control send one more request to a full
// engine until the next scrape. Allocation-free: three atomic loads.
func (e *Endpoint) Load() int64 {
	in := e.State.Inflight.Load()
	if el := e.State.engine.Load(); el != nil {
		return max(0, el.Requests+in-el.Mark+e.State.peerLoad.Load()-el.PeerMark, in-el.Ghosts)
	}
	return in
}

// Waiting is the engine's waiting count at the last scrape moved by the
// in-flight change since, as Load moves Requests (every new decision is
// assumed to wait: an overestimate until the next scrape); ok is false
// when no engine figure is known.
func (e *Endpoint) Waiting() (n int64, ok bool) {
	if el := e.State.engine.Load(); el != nil {
		return max(0, el.Waiting+e.State.Inflight.Load()-el.Mark), true
	}
	return 0, false
}

// Admits reports whether one more request would start at once rather than
// queue at load (the caller's Load reading): the engine reported no
// waiting request at its last scrape, and load is below what it ran the
// last time a scrape found it queueing (any load when it never queued).
// False when no engine figure is known. vLLM's capacity moves with the KV
// cache, so this is an estimate.
func (e *Endpoint) Admits(load int64) bool {
	el := e.State.engine.Load()
	if el == nil || el.Waiting > 0 {
		return false
	}
	c := e.State.running.Load()
	return c == 0 || load < c
}

// EngineLoad is one scrape of a replica's own metrics.
type EngineLoad struct {
	// Requests is running + waiting as the engine reported them.
	Requests int64
	// Waiting is the waiting part of Requests (flow control's max_waiting).
	Waiting int64
	// KVUsage is the engine's KV-cache usage in [0, 1] (-1: not reported).
	KVUsage float64
	// Mark is DecisionMark() taken as the scrape's page arrived, PeerMark
	// PeerMark() then.
	Mark     int64
	PeerMark int64
	// Missing is how many of the decisions at Mark the engine did not
	// count (Mark - Requests, at least 0), and Ghosts how many this page
	// and the one before both missed: completions the feedback lost or
	// requests served elsewhere, rather than requests still on their way
	// or completions still coming (on a first page, after none or a
	// failed scrape: all it missed). SetEngineLoad sets both.
	Missing, Ghosts int64
	// BlockSize is the engine's KV block size in tokens (vLLM's
	// cache_config_info; 0: not reported).
	BlockSize int
	// TTFTSeconds and TTFTCount are the engine's time-to-first-token
	// histogram's sum and count (cumulative; 0: not reported).
	TTFTSeconds float64
	TTFTCount   uint64
	// LoRA is the engine's vllm:lora_requests_info (nil: none).
	LoRA *LoRAState
}

// StartWindow starts a new recent-decisions window; the scraper calls it at
// every scrape attempt, failed or not, so windows are alike across endpoints.
func (e *Endpoint) StartWindow() {
	e.State.prevWindow.Store(e.State.window.Load())
	e.State.window.Store(e.State.Decisions.Load() + e.State.peer.Load() + 1)
}

// NotePeerDecision counts a decision another turnout instance made for this
// endpoint (cluster sync), so placements here even out the requests of
// every instance, not only this one's.
func (e *Endpoint) NotePeerDecision() { e.State.peer.Add(1) }

// Recent is the number of decisions made for this endpoint, here and by
// peers, since the last scrape attempt (0 when nothing scrapes): among equally loaded endpoints,
// the one that received fewer requests lately gets a new prompt, so
// placements even out request counts even when requests finish too fast to
// show as load.
func (e *Endpoint) Recent() uint64 {
	w := e.State.window.Load() // decisions + 1 at the window start, 0: never
	if w == 0 {
		return 0
	}
	return e.State.Decisions.Load() + e.State.peer.Load() + 1 - w
}

// Served is the number of decisions made for this endpoint, here and by
// peers, since the previous window started: one to two windows (2-4 s with
// the scraper's defaults), so the bounded-load guard of prefix-affinity
// never starts from nothing when a window turns over. 0 when nothing
// scrapes.
func (e *Endpoint) Served() uint64 {
	w := e.State.prevWindow.Load()
	if w == 0 {
		w = e.State.window.Load()
		if w == 0 {
			return 0
		}
	}
	return e.State.Decisions.Load() + e.State.peer.Load() + 1 - w
}

// DecisionMark is this endpoint's in-flight count, to pair with a scrape:
// Load adds the change since.
func (e *Endpoint) DecisionMark() int64 { return e.State.Inflight.Load() }

// PeerMark is the peers' in-flight count for this endpoint, to pair with a
// scrape: Load adds the change since.
func (e *Endpoint) PeerMark() int64 { return e.State.peerLoad.Load() }

// AddPeerLoad moves the peers' in-flight count (cluster sync: a peer
// reported a new level).
func (e *Endpoint) AddPeerLoad(d int64) { e.State.peerLoad.Add(d) }

// SetEngineLoad publishes a scrape; nil goes back to in-flight counts.
func (e *Endpoint) SetEngineLoad(l *EngineLoad) {
	if l != nil {
		l.Missing = max(0, l.Mark-l.Requests)
		l.Ghosts = l.Missing // a first page: nothing to tell them apart by
		if prev := e.State.engine.Load(); prev != nil {
			l.Ghosts = min(l.Missing, prev.Missing)
		}
		if l.Waiting > 0 {
			e.State.running.Store(max(1, l.Requests-l.Waiting))
		}
	}
	e.State.engine.Store(l)
}

// Engine returns the last published scrape, or nil.
func (e *Endpoint) Engine() *EngineLoad { return e.State.engine.Load() }

// Available reports whether the endpoint may receive requests.
// A degraded (stalled) or draining (terminating pod) endpoint is not available either.
func (e *Endpoint) Available() bool {
	return !e.Draining && !e.State.Down.Load() && !e.State.Stall.Degraded.Load()
}

// SetDown marks the endpoint down or up (health checks, tests).
func (e *Endpoint) SetDown(down bool) { e.State.Down.Store(down) }

// AddInflight adjusts the in-flight count (tests, simulations).
func (e *Endpoint) AddInflight(d int64) { e.State.Inflight.Add(d) }

// Pool is an immutable set of endpoints of one role with its policy.
type Pool struct {
	Name       string // HAProxy backend / nginx upstream name
	Deployment string
	Role       string
	PolicyName string
	Endpoints  []*Endpoint
	Policy     Policy
	// BlockBytes > 0 when the policy wants prompt block hashes.
	BlockBytes int
	// Records: the policy learns from other instances' decisions.
	Records bool
	// NameHdr is Name as a header value.
	NameHdr []byte
	// Metrics are the pool's decision counters (they survive reloads).
	Metrics *PoolMetrics
	// MinReady is how many available endpoints /readyz needs in this pool.
	MinReady int
	// OnFree, when set, is told that a decision of this pool closed (flow
	// control releases a held request).
	OnFree func()
}

// EndpointByName returns the pool's endpoint with that name, or nil.
func (p *Pool) EndpointByName(name []byte) *Endpoint {
	for _, e := range p.Endpoints {
		if string(e.NameHdr) == string(name) {
			return e
		}
	}
	return nil
}

// Degraded reports whether stall detection took the endpoint out.
func (e *Endpoint) Degraded() bool { return e.State.Stall.Degraded.Load() }
