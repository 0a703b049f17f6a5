package route

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
}

// Decider is the centre of turnout: it owns the routing snapshot, the
// policy registry and the decision ledger, and decides (decide.go). The
// transports and loops of route's top layer hold one (doc.go).
type Decider struct {
	log   *zerolog.Logger
	reg   *policy.Registry
	seed  uint64
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
	dec    *decisions
	pool   sync.Pool
	m      deciderMetrics
	ref    refusals
	pd     *pd.Client
	// ctx ends background work owned by policies (KV subscriptions).
	ctx    context.Context
	cancel context.CancelFunc
	// onApply hooks run after every accepted snapshot (e.g. KV subscribers).
	onApply []func(*Snapshot)
	// reqlog is the request log's sink and sampling (decisions.go); nil: off.
	reqlog atomic.Pointer[requestLog]
	// sink receives prefix decisions for other instances (cluster sync).
	sink atomic.Pointer[sinkBox]
	// kvHub owns bound KV-event sockets, shared by every pool using them.
	kvHub *kv.Hub
	// healthRound is set once a full round of health checks has finished.
	healthRound atomic.Bool
	// flows are the flow controllers of the deployments with flow_control.
	flows *flow.Set
	// observe, when set (tests), sees each request's Request as the handler
	// returns: the proof that the body is scanned once.
	observe func(*fleet.Request)

	// fbStalled: route/feedback found completions stopped (SetFeedbackStalled).
	fbStalled atomic.Bool
	// onTick hooks run after each sweep (OnTick); readiness writes extra
	// /readyz?verbose lines (AddReadiness).
	onTick    atomic.Pointer[[]func(context.Context, *Snapshot, time.Time)]
	readiness []func(*strings.Builder)
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
	s := &Decider{
		log:    opts.Log,
		reg:    opts.Registry,
		seed:   opts.Seed,
		store:  newStateStore(),
		seen:   models.NewSeen(),
		loader: models.NewLoader(),
		mstats: models.NewStats(),
		dec:    newDecisions(opts.DecisionSlots, opts.Seed),
		flows:  flow.NewSet(),
	}
	s.m.init()
	s.AddMetrics(s.mstats.WriteMetrics)
	s.AddMetrics(s.flows.WriteMetrics)
	s.AddReadiness(s.flows.WriteReadiness)
	s.pd = pd.New()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.kvHub = kv.NewHub(s.ctx, s.log)
	if err := s.Apply(cfg); err != nil {
		s.cancel()
		s.kvHub.Close()
		return nil, err
	}
	return s, nil
}

// Close stops background work owned by policies.
func (s *Decider) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	closeAll(s.pols)
	s.flows.Close()
	s.kvHub.Close()
	s.cancel()
}

// OnApply registers a hook run (synchronously) after each accepted snapshot.
func (s *Decider) OnApply(fn func(*Snapshot)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onApply = append(s.onApply, fn)
	if snap := s.snap.Load(); snap != nil {
		fn(snap)
	}
}

// Apply swaps in a new config. Surviving endpoints keep their state; on error
// the old snapshot stays.
func (s *Decider) Apply(cfg *config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := cfg.Validate(); err != nil {
		s.m.reloadFailed.Add(1)
		return err
	}
	snap, pols, err := buildSnapshot(cfg, s.reg, s.snap.Load(), s.store, fleet.PolicyEnv{Log: s.log, Ctx: s.ctx, KVHub: s.kvHub}, s.seed)
	if err != nil {
		s.m.reloadFailed.Add(1)
		return err
	}
	snap.models.Store(models.Build(snap.deps, s.seen, s.mstats))
	old := s.pols
	s.bindFlow(snap)
	s.snap.Store(snap)
	s.pols = pols
	closeAll(old)
	s.m.reloads.Add(1)
	for _, fn := range s.onApply {
		fn(snap)
	}
	return nil
}

// RefreshModels rebuilds the model table after what an endpoint serves
// changed (route/health's /v1/models poll, the engine scraper's LoRA
// report, discovery's labels): decisions see it at once.
func (s *Decider) RefreshModels() {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := s.snap.Load()
	snap.models.Store(models.Build(snap.deps, s.seen, s.mstats))
}

// Rejected counts a config that failed before reaching Apply (unreadable or
// invalid file), so /metrics shows every rejected reload.
func (s *Decider) Rejected() { s.m.reloadFailed.Add(1) }

// Snapshot returns the live snapshot.
func (s *Decider) Snapshot() *Snapshot { return s.snap.Load() }

// Complete closes a decision by id (feedback from the proxy).
// A sampled one goes to the request log, without the proxy's figures.
func (s *Decider) Complete(id uint64) bool { return s.CloseDecisionWith(id, NoCompletion()) != nil }

// Run ticks until ctx ends: each tick expires stale decisions (the
// ledger's sweep), then runs the OnTick hooks (route/feedback watches
// completion feedback and stalled endpoints there). Ticks come a quarter
// of the smallest stall budget apart, within 100ms..1s.
func (s *Decider) Run(ctx context.Context) {
	t := time.NewTimer(stallTick(s.snap.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			snap := s.snap.Load()
			s.tick(ctx, snap, now)
			t.Reset(stallTick(snap))
		}
	}
}

// PrefixSink receives every decision of a PrefixRecorder pool (blocks is
// empty for a prompt shorter than one block), on the hot path: it must not
// block or allocate, and must not keep blocks (a view into per-request
// scratch memory).
type PrefixSink interface {
	RoutedPrefix(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64)
}

// sinkBox lets an interface live in an atomic.Pointer.
type sinkBox struct{ PrefixSink }

// SetPrefixSink installs (or, with nil, removes) the prefix decision sink.
func (s *Decider) SetPrefixSink(ps PrefixSink) {
	if ps == nil {
		s.sink.Store(nil)
		return
	}
	s.sink.Store(&sinkBox{ps})
}

// Log is the decider's logger, for the loops that hold it.
func (s *Decider) Log() *zerolog.Logger { return s.log }

// NoteHealthCheck counts one active health check (route/health).
func (s *Decider) NoteHealthCheck(ok bool) {
	if ok {
		s.m.health[0].Add(1)
	} else {
		s.m.health[1].Add(1)
	}
}

// HealthChecks is how many active health checks passed and failed.
func (s *Decider) HealthChecks() (ok, failed uint64) {
	return s.m.health[0].Load(), s.m.health[1].Load()
}

// HealthRoundDone notes that a full round of health checks finished:
// readiness trusts endpoints' health from then on.
func (s *Decider) HealthRoundDone() { s.healthRound.Store(true) }

// HealthRounded reports whether a full round of health checks finished.
func (s *Decider) HealthRounded() bool { return s.healthRound.Load() }

// Readiness (/readyz) means "turnout can route every deployment now":
//
//   - with active health checks on, nothing is ready until the first round
//     has checked every endpoint (before it, an unreachable replica looks
//     exactly like a healthy one); then each pool needs at least min_ready
//     endpoints that passed a check and are not down;
//   - with health.disable there is no evidence either way, so each pool needs
//     min_ready endpoints that nothing has marked down.
//
// min_ready is health.min_ready (default 1), or the pool's own min_ready.

// WriteReadiness writes the verdict line ("ready" or "not ready: why") and,
// when verbose, one line per pool; it reports whether turnout is ready.
// Other readiness facts append their own lines after these.
func (s *Decider) WriteReadiness(b *strings.Builder, verbose bool) bool {
	snap := s.snap.Load()
	checks := !snap.Config.Health.Disable && snap.Config.Health.Interval > 0
	var why string
	if checks && !s.healthRound.Load() {
		why = "first health round not finished"
	}
	type poolLine struct {
		p          *fleet.Pool
		avail, min int
	}
	var pools []poolLine
	for _, p := range snap.Pools() {
		n := 0
		for _, e := range p.Endpoints {
			if e.Available() && (!checks || e.State.Checked.Load()) {
				n++
			}
		}
		pools = append(pools, poolLine{p, n, p.MinReady})
		if why == "" && n < p.MinReady {
			why = fmt.Sprintf("pool %s has %d available endpoints, needs %d", p.Name, n, p.MinReady)
		}
	}
	if why == "" {
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready: " + why + "\n")
	}
	if verbose {
		for _, l := range pools {
			verdict := "ok"
			if l.avail < l.min {
				verdict = "short"
			}
			fmt.Fprintf(b, "pool %s: %d/%d available, min_ready %d, %s\n", l.p.Name, l.avail, len(l.p.Endpoints), l.min, verdict)
		}
		writeModelLines(b, snap)
	}
	return why == ""
}

// stallTick is how often decisions are swept: a quarter of the smallest
// budget, within 100ms..1s (1s, the TTL sweep, when detection is off).
func stallTick(snap *Snapshot) time.Duration {
	t := time.Second
	for _, p := range snap.Pools() {
		if len(p.Endpoints) == 0 {
			continue
		}
		if b := time.Duration(p.Endpoints[0].State.Stall.BudgetNs.Load()); b > 0 {
			t = min(t, max(b/4, 100*time.Millisecond))
		}
	}
	return t
}

// tick runs the periodic work: the decision ledger's TTL sweep (which also
// marks endpoints holding a decision past half their stall budget, while
// completions arrive), then the hooks (route/feedback: feedback and stall
// checks).
func (s *Decider) tick(ctx context.Context, snap *Snapshot, now time.Time) {
	healthy := !s.fbStalled.Load() && s.dec.completed.Load() > 0
	s.dec.sweep(now, snap.Config.DecisionTTL.D(), healthy)
	if hooks := s.onTick.Load(); hooks != nil {
		for _, fn := range *hooks {
			fn(ctx, snap, now)
		}
	}
}

// Sweep runs one tick of Run at now: the ledger's TTL sweep, then the
// hooks (tests and simulations drive time with it).
func (s *Decider) Sweep(ctx context.Context, now time.Time) { s.tick(ctx, s.snap.Load(), now) }

// OnTick registers a hook run on every tick of Run, after the ledger's
// sweep (route/feedback's checks).
func (s *Decider) OnTick(fn func(ctx context.Context, snap *Snapshot, now time.Time)) {
	for {
		old := s.onTick.Load()
		var next []func(context.Context, *Snapshot, time.Time)
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, fn)
		if s.onTick.CompareAndSwap(old, &next) {
			return
		}
	}
}

// SetFeedbackStalled tells the ledger whether completions stopped arriving
// (route/feedback): a decision open for long then proves nothing about its
// endpoint.
func (s *Decider) SetFeedbackStalled(stalled bool) { s.fbStalled.Store(stalled) }

// CloseDecision completes a decision by id and returns the state of its
// endpoint (nil when the id is unknown or already completed).
func (s *Decider) CloseDecision(id uint64) *fleet.State { return s.dec.closeState(id) }

// ReconcileLedger closes the decisions opened before 'before' that a
// feedback outage left open, keeping per endpoint as many as its engine
// last reported (route/feedback calls it when completions arrive again);
// it returns how many it closed.
func (s *Decider) ReconcileLedger(before time.Time) uint64 {
	return s.dec.reconcile(before.UnixNano())
}

// LedgerCounts are the decisions opened and completed so far, and how many
// had been opened at the last completion.
func (s *Decider) LedgerCounts() (opened, completed, openedAtClose uint64) {
	return s.dec.opened(), s.dec.completed.Load(), s.dec.openedAtClose.Load()
}

// AddReadiness registers a writer of extra /readyz?verbose lines (facts
// that never change readiness itself: completion feedback, degraded
// endpoints).
func (s *Decider) AddReadiness(fn func(*strings.Builder)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readiness = append(s.readiness, fn)
}

// WriteReadinessNotes writes the AddReadiness lines.
func (s *Decider) WriteReadinessNotes(b *strings.Builder) {
	s.mu.Lock()
	fns := s.readiness
	s.mu.Unlock()
	for _, fn := range fns {
		fn(b)
	}
}

// maxModelLines bounds /readyz?verbose's model lines (a fleet may have
// thousands of adapters).
const maxModelLines = 500

// writeModelLines writes one /readyz?verbose line per model name: which
// endpoints of its serving pool serve it and how many of those are
// available (a model can be short while its pool is ready).
func writeModelLines(b *strings.Builder, snap *Snapshot) {
	t := snap.models.Load()
	for i, name := range t.Names {
		if i == maxModelLines {
			fmt.Fprintf(b, "models: %d more (turnout_model_decisions_total lists every one)\n", len(t.Names)-i)
			break
		}
		e := t.Lookup([]byte(name))
		pool := snap.Deployments[e.Dep].Serve
		var on []string
		avail := 0
		for i, ep := range pool.Endpoints {
			if e.Only[0].Has(i) {
				on = append(on, ep.Name)
				if ep.Available() {
					avail++
				}
			}
		}
		kind, verdict := "model", "ok"
		if e.Adapter {
			kind = "adapter"
		}
		switch {
		case e.Refuse == models.RefuseUnknown:
			verdict = "not served (404)"
		case avail == 0:
			verdict = "unavailable (503)"
		}
		fmt.Fprintf(b, "%s %s: served by %d/%d of pool %s [%s], %d available, %s\n", kind, name, len(on), len(pool.Endpoints), pool.Name, strings.Join(on, " "), avail, verdict)
	}
}

// loadOnDemand loads an adapter no endpoint serves on the endpoint the
// deployment's policy picks, when the deployment has lora.load_on_demand
// and claims the name (route/models/load.go), and returns the model entry
// after the load; nil when it does not apply or the load failed (the
// caller refuses as before). It blocks this request for at most
// lora.load_timeout; every load is counted and logged.
func (s *Decider) loadOnDemand(snap *Snapshot, model []byte, me *models.Entry, sc *Txn) *models.Entry {
	var d *Deployment
	name := string(model)
	if me != nil {
		d = snap.Deployments[me.Dep]
		if !models.Loadable(d.Config, name) {
			return nil // only the names it claims for loading: their lora_path is known
		}
	} else {
		for _, cand := range snap.Deployments {
			if models.Loadable(cand.Config, name) {
				d = cand
				break
			}
		}
	}
	if d == nil || d.Serve == nil {
		return nil
	}
	dc := d.Config
	r := &sc.req
	r.Only, r.Adapter, r.AdapterHash = nil, true, fleet.HashKey(model)
	c := &sc.choices[0]
	*c = fleet.Choice{Endpoints: sc.picks[0:0:1], Work: c.Work}
	d.Serve.Policy.Pick(r, d.Serve, c)
	if len(c.Endpoints) == 0 {
		return nil
	}
	e := c.Endpoints[0]
	timeout := dc.LoRA.LoadTimeout.D()
	if timeout <= 0 {
		timeout = models.DefaultLoadTimeout
	}
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	defer cancel()
	start := time.Now()
	evict, err := s.loader.Load(ctx, dc, e, name)
	s.noteLoad(d.Name, name, err == nil)
	if err != nil {
		s.log.Warn().Err(err).Str(fleet.FieldDeployment, d.Name).Str(fleet.FieldEndpoint, e.Name).Str("adapter", name).
			Msg("lora: load on demand failed; the request is refused as if nothing served the adapter")
		return nil
	}
	s.log.Info().Str(fleet.FieldDeployment, d.Name).Str(fleet.FieldEndpoint, e.Name).Str("adapter", name).
		Dur("took", time.Since(start)).Str("unloads", evict).Msg("lora: adapter loaded on demand")
	addServed(e, fleet.ServedModel{ID: name, Parent: dc.Models[0]}, evict)
	if evict != "" {
		go func() {
			ctx, cancel := context.WithTimeout(s.ctx, timeout)
			defer cancel()
			if err := s.loader.Unload(ctx, e.Address, evict); err != nil {
				s.log.Warn().Err(err).Str(fleet.FieldEndpoint, e.Name).Str("adapter", evict).Msg("lora: unload of a cold adapter failed")
				return
			}
			s.noteUnload(d.Name, evict)
		}()
	}
	s.RefreshModels()
	*c = fleet.Choice{Work: c.Work}
	return s.snap.Load().models.Load().Lookup(model)
}

// addServed adds m to e's model list (and drops evict), as the next
// /v1/models poll will find it.
func addServed(e *fleet.Endpoint, m fleet.ServedModel, evict string) {
	next := &fleet.ServedModels{Source: fleet.ModelsListed}
	if old := e.ServedModels(); old != nil {
		next.Source = old.Source
		for _, o := range old.Models {
			if o.ID != m.ID && o.ID != evict {
				next.Models = append(next.Models, o)
			}
		}
	}
	next.Models = append(next.Models, m)
	e.SetServed(next)
}

// noteLoad and noteUnload count lora.load_on_demand's calls.
func (s *Decider) noteLoad(dep, adapter string, ok bool) {
	ms := s.mstats.For(adapter, dep, true)
	if ok {
		ms.Loads.Add(1)
	} else {
		ms.LoadFailures.Add(1)
	}
}

func (s *Decider) noteUnload(dep, adapter string) { s.mstats.For(adapter, dep, true).Unloads.Add(1) }
