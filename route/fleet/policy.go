package fleet

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
)

// Prediction is one decision's predicted time to first token and the
// figures it was predicted from, so the completion can be learned from.
type Prediction struct {
	TTFTMs float32 // 0: no prediction
	// Load is the chosen endpoint's load, Pending its queued prefill
	// bytes (State.Pending) and Uncached the prompt bytes it was not
	// thought to hold, at decision time.
	Load, Pending, Uncached int32
}

// TTFTLearner is implemented by policies that learn from completions'
// first-token times: the ledger calls it when a decision with a prediction
// closes with the time the proxy saw the first response body bytes (tft,
// never the headers' time), the endpoint that answered being the one chosen.
type TTFTLearner interface {
	LearnTTFT(e *Endpoint, p Prediction, firstTokenMs int64)
}

// LoadAware is implemented by policies whose choice reads endpoints'
// in-flight counts, which fall only when completions are fed back.
type LoadAware interface {
	LoadAware() bool
}

// Log field names.
const (
	FieldDeployment = "deployment"
	FieldPool       = "pool"
	FieldEndpoint   = "endpoint"
	FieldReason     = "reason"
)

// Request is what a policy sees of one request: its inputs only (what the
// policy chose goes into a Choice). Byte slices are views into fasthttp
// buffers, valid only during Pick; store hashes, never the slices.
type Request struct {
	Model   []byte
	Session []byte
	// SessionHash is hashKey(Session), computed once by the handler.
	SessionHash uint64
	HasSession  bool
	// Blocks are the prompt's chained block hashes (PromptUser policies only).
	Blocks []uint64
	// PromptBytes is the prompt's length in bytes (an uncached-work estimate).
	PromptBytes int
	// Truncated is set when the proxy forwarded only a prefix of the body.
	Truncated bool
	// Payload is the request body, indexed once (model, prompt pieces, token
	// ids, top-level members); policies read it instead of the body.
	Payload *payload.Index
	// Only are the endpoints of the pool that serve Model (nil: every one);
	// policies consider no other (Cycle.Usable).
	Only Mask
	// Adapter: Model is a LoRA adapter (route/models), AdapterHash its
	// HashKey (set only then).
	Adapter     bool
	AdapterHash uint64
	// TTFTObjectiveMs is what is left of the request's time-to-first-token
	// objective (route/flow/slo.go) after flow control held it (0: none;
	// a request held past its objective has 1 ms left). A TTFT-predicting
	// policy picks a replica predicted to meet it.
	TTFTObjectiveMs float32
}

// Choice is a policy's answer for one request, kept apart from the Request
// so that inputs and outputs cannot be confused. The caller sizes
// Endpoints (len 0, cap = how many it wants) and zeroes the rest; it lives
// in per-request scratch memory, so a decision allocates nothing.
type Choice struct {
	// Endpoints are the picked endpoints, distinct and available, best
	// first; empty when none was picked (see Reject).
	Endpoints []*Endpoint
	// Outcome classifies the decision for metrics.
	Outcome Outcome
	// Matched is the matched prefix length in blocks (prefix policies).
	Matched int
	// Reject is set by a strict policy that refuses the request.
	Reject RejectReason
	// Predicted is what a TTFT-predicting policy expected of its first
	// choice (zero: no prediction); the ledger keeps it until the
	// completion's first-token time teaches the policy (TTFTLearner).
	Predicted Prediction
	// Notes are the figures the policy wants logged with the decision
	// (note.go): the pipeline copies them and never reads them.
	Notes Notes
	// Work is a policy's working memory for one decision, kept with the
	// caller's pooled per-request scratch (the Decider's Txn) so that a
	// policy takes none from a pool of its own; nil: the policy does.
	// Callers keep it when they reset a Choice.
	Work any
}

// RejectReason is why a strict policy refused a request.
type RejectReason uint8

// Reject reasons.
const (
	RejectNone        RejectReason = iota
	RejectBadBody                  // 400: the policy needs what the body lacks
	RejectUnavailable              // 503: a dependency (tokenizer) is down
)

// Outcome classifies how a decision was made.
type Outcome uint8

// Outcomes; keep outcomeNames in sync.
const (
	OutcomeBalanced   Outcome = iota // no key: load balanced
	OutcomeAffinity                  // session or prefix key honoured
	OutcomeOverflow                  // key present but its replica was too loaded
	OutcomeNoEndpoint                // nothing available
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{"balanced", "affinity", "overflow", "no_endpoint"}

func (o Outcome) String() string { return outcomeNames[o] }

// Policy picks endpoints for a request.
type Policy interface {
	// Pick appends up to cap(c.Endpoints)-len(c.Endpoints) distinct
	// available endpoints of p to c.Endpoints, best first, and sets c's
	// other fields; it only reads r. No endpoint means none is available,
	// or c.Reject says why the policy refused. It must not allocate and
	// must be safe for concurrent use.
	Pick(r *Request, p *Pool, c *Choice)
	// Signals is what it reads of an endpoint (the union of its stages').
	Consumer
}

// PromptUser is implemented by policies that need the prompt's block hashes.
type PromptUser interface {
	// BlockBytes is the prefix block size in bytes.
	BlockBytes() int
}

// Stater is implemented by policies whose per-endpoint state must survive a
// reload; Carry moves the state of endpoints that still exist from prev.
type Stater interface {
	Carry(prev Policy)
}

// Starter is implemented by policies that start work (subscriptions) once
// their state is settled, after Carry.
type Starter interface{ Start(p *Pool) }

// Closer is implemented by policies that own goroutines or sockets.
type Closer interface{ Close() }

// MetricsWriter is implemented by policies with metrics of their own.
type MetricsWriter interface {
	WriteMetrics(p *Pool, b *strings.Builder)
}

// PolicyEnv is what a factory gets besides its params.
type PolicyEnv struct {
	Pool *Pool
	Rand *Rand
	Log  *zerolog.Logger
	// Ctx lives as long as the server; background work stops with it.
	Ctx context.Context
	// KVHub owns the server's bound KV-event sockets (nil: policies make
	// their own).
	KVHub *kv.Hub
	// Clock is what time-dependent policy state reads (nil: the wall clock).
	Clock Clock
}

// Rand is a concurrency-safe, seedable, allocation-free source (splitmix64
// over an atomic counter): deterministic in single-threaded tests.
type Rand struct{ state atomic.Uint64 }

// NewRand returns a source with the given seed.
func NewRand(seed uint64) *Rand {
	r := &Rand{}
	r.state.Store(seed)
	return r
}

// Uint64 returns the next value.
func (r *Rand) Uint64() uint64 { return Mix64(r.state.Add(0x9e3779b97f4a7c15)) }

// Intn returns a value in [0, n).
func (r *Rand) Intn(n int) int { return int(r.Uint64() % uint64(n)) }

// PrefixRecorder is implemented by policies whose approximate prefix index
// can learn what another turnout instance routed (cluster sync). kv-aware
// does not implement it: every instance reads the engines' own events.
type PrefixRecorder interface {
	// RecordPrefix marks blocks as sent to the endpoint at index i.
	RecordPrefix(i int, blocks []uint64)
}
