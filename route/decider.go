package route

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/flow"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/models"
	"github.com/turnout/turnout/route/pd"
	"github.com/turnout/turnout/route/policy"
)

// ErrNoEndpoint is returned when no endpoint is available.
var ErrNoEndpoint = errors.New("no available endpoint")

// Options configure a Decider.
type Options struct {
	Registry *policy.Registry
	Log      *zerolog.Logger
	// Seed drives policy randomness; 0 picks one at random. Decision ids
	// are random whatever the seed (unguessable, see decisions.go).
	Seed uint64
	// DecisionSlots bounds tracked in-flight decisions (default 1<<16).
	DecisionSlots int
	// Clock is what policies' time-dependent state reads (nil: the wall
	// clock; benchmarks give a synthetic one, fleet.StepClock).
	Clock fleet.Clock
}

// Decider is the centre of turnout: it owns the routing snapshot, the
// policy registry and the decision ledger, and decides (decide.go). The
// transports and loops of route's top layer hold one (doc.go).
type Decider struct {
	log   *zerolog.Logger
	reg   *policy.Registry
	seed  uint64
	clock fleet.Clock // policies' clock (nil: the wall clock)
	snap  atomic.Pointer[Snapshot]
	mu    sync.Mutex // serializes Apply
	store *stateStore
	// seen remembers the model names endpoints served (route/models), under mu.
	seen *models.Seen
	// loader loads adapters on demand (lora.load_on_demand, route/models/load.go);
	// mstats are the per-model counters.
	loader *models.Loader
	mstats *models.Stats
	pols   []fleet.Policy
	dec    *Ledger
	txns   txnPool
	m      deciderMetrics
	ref    Refusals
	// extras are the /metrics and /readyz writers other packages add.
	extras Extras
	pd     *pd.Client
	// ctx ends background work owned by policies (KV subscriptions).
	ctx    context.Context
	cancel context.CancelFunc
	// onApply hooks run after every accepted snapshot (e.g. KV subscribers).
	onApply []func(*Snapshot)
	// sink receives prefix decisions for other instances (cluster sync).
	sink hook[PrefixSink]
	// kvHub owns bound KV-event sockets, shared by every pool using them.
	kvHub *kv.Hub
	// health counts active health checks and notes their first full round.
	health HealthBook
	// wasReady: /readyz said ready once; from then on it no longer waits
	// for new endpoints' model lists (readiness.go).
	wasReady atomic.Bool
	// flows are the flow controllers of the deployments with flow_control.
	flows *flow.Set
	// ticker sweeps the ledger and runs the tick hooks (ticker.go).
	ticker Ticker
}

// New builds a Decider from a validated config.
func New(cfg *config.Config, opts Options) (*Decider, error) {
	if opts.Registry == nil {
		opts.Registry = policy.DefaultRegistry()
	}
	if opts.Log == nil {
		l := zerolog.Nop()
		opts.Log = &l
	}
	if opts.Seed == 0 {
		opts.Seed = rand.Uint64()
	}
	if opts.DecisionSlots == 0 {
		opts.DecisionSlots = 1 << 16
	}
	d := &Decider{
		log:    opts.Log,
		reg:    opts.Registry,
		seed:   opts.Seed,
		clock:  opts.Clock,
		store:  newStateStore(),
		seen:   models.NewSeen(),
		loader: models.NewLoader(),
		mstats: models.NewStats(),
		dec:    newDecisions(opts.DecisionSlots, opts.Seed),
		flows:  flow.NewSet(),
	}
	d.ticker.snap, d.ticker.dec = &d.snap, d.dec
	d.ref.log = d.log
	d.extras.AddMetrics(d.mstats.WriteMetrics)
	d.extras.AddMetrics(d.flows.WriteMetrics)
	d.extras.AddReadiness(d.flows.WriteReadiness)
	d.extras.AddReadiness(signalsReadiness(&d.snap))
	d.pd = pd.New()
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.kvHub = kv.NewHub(d.ctx, d.log)
	if err := d.Apply(cfg); err != nil {
		d.cancel()
		d.kvHub.Close()
		return nil, err
	}
	return d, nil
}

// Close stops background work owned by policies.
func (d *Decider) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	closeAll(d.pols)
	d.flows.Close()
	d.kvHub.Close()
	d.cancel()
}

// OnApply registers a hook run (synchronously) after each accepted snapshot.
func (d *Decider) OnApply(fn func(*Snapshot)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.onApply = append(d.onApply, fn)
	if snap := d.snap.Load(); snap != nil {
		fn(snap)
	}
}

// Apply swaps in a new config. Surviving endpoints keep their state; on error
// the old snapshot stays.
func (d *Decider) Apply(cfg *config.Config) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := cfg.Validate(); err != nil {
		d.m.reloadFailed.Add(1)
		return err
	}
	snap, pols, err := buildSnapshot(cfg, d.reg, d.snap.Load(), d.store, fleet.PolicyEnv{Log: d.log, Ctx: d.ctx, KVHub: d.kvHub, Clock: d.clock}, d.seed)
	if err != nil {
		d.m.reloadFailed.Add(1)
		return err
	}
	snap.models.Store(models.Build(snap.deps, d.seen, d.mstats))
	old := d.pols
	bindFlow(d.flows, snap)
	d.snap.Store(snap)
	d.pols = pols
	closeAll(old)
	d.m.reloads.Add(1)
	for _, fn := range d.onApply {
		fn(snap)
	}
	return nil
}

// RefreshModels rebuilds the model table after what an endpoint serves
// changed (route/health's /v1/models poll, the engine scraper's LoRA
// report, discovery's labels): decisions see it at once.
func (d *Decider) RefreshModels() {
	d.mu.Lock()
	defer d.mu.Unlock()
	snap := d.snap.Load()
	snap.models.Store(models.Build(snap.deps, d.seen, d.mstats))
}

// Rejected counts a config that failed before reaching Apply (unreadable or
// invalid file), so /metrics shows every rejected reload.
func (d *Decider) Rejected() { d.m.reloadFailed.Add(1) }

// Snapshot returns the live snapshot.
func (d *Decider) Snapshot() *Snapshot { return d.snap.Load() }

// Ledger is the decision ledger: the decisions open until the proxy's
// feedback closes them, and the recent ones the request log and GET
// /internal/decision/<id> read.
func (d *Decider) Ledger() *Ledger { return d.dec }

// Ticker is the loop that sweeps the ledger and runs the tick hooks
// (ticker.go): control runs it, route/feedback hooks its checks on it.
func (d *Decider) Ticker() *Ticker { return &d.ticker }

// PrefixSink receives every decision of a PrefixRecorder pool (blocks is
// empty for a prompt shorter than one block), on the hot path: it must not
// block or allocate, and must not keep blocks (a view into per-request
// scratch memory).
type PrefixSink interface {
	RoutedPrefix(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64)
}

// hook holds an optional interface value (the prefix sink, the tracer)
// that the decision path loads without a lock; the zero hook holds none.
type hook[T any] struct{ p atomic.Pointer[struct{ v T }] }

// set installs v or, with a nil v, removes what was installed.
func (h *hook[T]) set(v T) {
	if any(v) == nil {
		h.p.Store(nil)
		return
	}
	h.p.Store(&struct{ v T }{v})
}

// get is the installed value; ok is false when none is.
func (h *hook[T]) get() (v T, ok bool) {
	if b := h.p.Load(); b != nil {
		return b.v, true
	}
	return v, false
}

// SetPrefixSink installs (or, with nil, removes) the prefix decision sink.
func (d *Decider) SetPrefixSink(ps PrefixSink) { d.sink.set(ps) }

// Log is the decider's logger, for the loops that hold it.
func (d *Decider) Log() *zerolog.Logger { return d.log }

// Refusals counts what turnout refused on its own (the transports note
// theirs here).
func (d *Decider) Refusals() *Refusals { return &d.ref }

// Extras are the /metrics writers and /readyz?verbose lines other
// packages add.
func (d *Decider) Extras() *Extras { return &d.extras }

// Health is the record of active health checks route/health keeps.
func (d *Decider) Health() *HealthBook { return &d.health }
