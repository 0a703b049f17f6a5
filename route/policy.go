package route

import (
	"context"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
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
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"balanced", "affinity", "overflow", "no_endpoint"}

func (o Outcome) String() string { return outcomeNames[o] }

// Policy picks endpoints for a request.
type Policy interface {
	// Pick appends up to cap(c.Endpoints)-len(c.Endpoints) distinct
	// available endpoints of p to c.Endpoints, best first, and sets c's
	// other fields; it only reads r. No endpoint means none is available,
	// or c.Reject says why the policy refused. It must not allocate and
	// must be safe for concurrent use.
	Pick(r *Request, p *Pool, c *Choice)
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
}

// Factory builds a policy for one pool from its config; params are validated here.
type Factory func(cfg *config.PolicyConfig, env PolicyEnv) (Policy, error)

// Registry maps policy names to factories. Registration is explicit (no init()).
type Registry struct {
	m map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]Factory{}} }

// Register adds a factory; a duplicate name is a programming error.
func (r *Registry) Register(name string, f Factory) {
	if _, dup := r.m[name]; dup {
		panic("route: policy registered twice: " + name)
	}
	r.m[name] = f
}

// Names lists registered policies, sorted.
func (r *Registry) Names() []string {
	out := make([]string, 0, len(r.m))
	for n := range r.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Build builds the named policy.
func (r *Registry) Build(cfg *config.PolicyConfig, env PolicyEnv) (Policy, error) {
	f, ok := r.m[cfg.Name]
	if !ok {
		return nil, cfg.UnknownPolicy(r.Names())
	}
	p, err := f(cfg, env)
	if err != nil {
		return nil, cfg.ParamsError(err)
	}
	return p, nil
}

// DefaultRegistry registers the built-in policies.
func DefaultRegistry() *Registry {
	r := NewRegistry()
	r.Register(RoundRobinType, NewRoundRobinFactory())
	r.Register(LeastRequestType, NewLeastRequestFactory())
	r.Register(SessionHashType, NewSessionHashFactory())
	r.Register(PrefixAffinityType, NewPrefixAffinityFactory())
	r.Register(KVAwareType, NewKVAwareFactory())
	return r
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
func (r *Rand) Uint64() uint64 { return mix64(r.state.Add(0x9e3779b97f4a7c15)) }

// Intn returns a value in [0, n).
func (r *Rand) Intn(n int) int { return int(r.Uint64() % uint64(n)) }

// contains reports whether e is already in dst (dst is tiny).
func contains(dst []*Endpoint, e *Endpoint) bool {
	for _, d := range dst {
		if d == e {
			return true
		}
	}
	return false
}

// fillLeastLoaded appends the least-loaded available endpoints not yet in
// dst until dst is full; ties go to the fewest decisions since the last
// scrape, then to the earliest after a random rotation so equal loads spread.
func fillLeastLoaded(dst []*Endpoint, p *Pool, rnd *Rand) []*Endpoint {
	n := len(p.Endpoints)
	if n == 0 {
		return dst
	}
	off := 0
	if rnd != nil {
		off = rnd.Intn(n)
	}
	for len(dst) < cap(dst) {
		var best *Endpoint
		var bestLoad int64
		var bestRecent uint64
		for i := 0; i < n; i++ {
			e := p.Endpoints[(i+off)%n]
			if !e.Available() || contains(dst, e) {
				continue
			}
			l := e.Load()
			if best != nil && l > bestLoad {
				continue
			}
			if r := e.recent(); best == nil || l < bestLoad || r < bestRecent {
				best, bestLoad, bestRecent = e, l, r
			}
		}
		if best == nil {
			return dst
		}
		dst = append(dst, best)
	}
	return dst
}

// lowestLoad is the lowest Load among available endpoints; ok is false when
// none is available.
func lowestLoad(p *Pool) (minLoad int64, ok bool) {
	for _, e := range p.Endpoints {
		if e.Available() {
			if l := e.Load(); !ok || l < minLoad {
				minLoad, ok = l, true
			}
		}
	}
	return minLoad, ok
}

// loadSummary is the lowest Load and the summed recent decisions over the n
// available endpoints (n == 0: none available), in one pass.
func loadSummary(p *Pool, withServed bool) (minLoad int64, served uint64, n int) {
	for _, e := range p.Endpoints {
		if e.Available() {
			l := e.Load()
			if n == 0 || l < minLoad {
				minLoad = l
			}
			if withServed { // only the bounded-load guard reads it
				served += e.served()
			}
			n++
		}
	}
	return minLoad, served, n
}

// tooLoaded is SGLang's imbalance test applied to one candidate: it is more
// than abs requests above the least loaded and more than rel times it.
func tooLoaded(load, minLoad, abs int64, rel float64) bool {
	return load-minLoad > abs && float64(load) > rel*float64(minLoad)
}
