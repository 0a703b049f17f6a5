package route

import (
	"cmp"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/turnout/turnout/internal/config"

	"github.com/cespare/xxhash/v2"

	"github.com/turnout/turnout/route/kv"
)

// endpointState is the part of an endpoint that survives config reloads.
// It must not be copied (atomics).
type endpointState struct {
	inflight  atomic.Int64
	down      atomic.Bool
	fails     atomic.Int32
	decisions atomic.Uint64
	// engine is the last engine-reported load (nil: none, use inflight).
	engine atomic.Pointer[EngineLoad]
	// window is 1 + decisions + peer at the last window start (0: none),
	// prevWindow the same at the window start before it.
	window, prevWindow atomic.Uint64
	// peer counts other instances' decisions for this endpoint (cluster sync).
	peer atomic.Uint64
	// checked: a health check has judged it; seenUp: one has passed.
	checked, seenUp atomic.Bool
	// Completion feedback and stall detection (feedback_metrics.go, stall.go).
	expired atomic.Uint64 // decisions closed by TTL or ring wrap, never completed
	fb      endpointFeedback
	stall   stallState
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
	KVPattern kv.TopicPattern

	// Draining endpoints get no new decisions (terminating pods).
	Draining bool
	Index    int    // position in the pool
	Seed     uint64 // per-endpoint hash seed, fixed by name
	name     []byte // pre-built header values: no conversion on the hot path
	addr     []byte
	st       *endpointState
}

// Inflight is the number of decisions sent to this endpoint not yet completed.
func (e *Endpoint) Inflight() int64 { return e.st.inflight.Load() }

// Load is the figure every policy balances on: the engine's own count of
// running + waiting requests at the last scrape, moved by this instance's
// in-flight change since that scrape (decisions opened minus completed: a
// burst between scrapes is seen at once, and a finished request stops
// counting), or the in-flight count when no engine figure is known
// (scraping off or failing). Counting the change rather than the level
// keeps a lost completion from inflating the figure beyond one scrape.
// Allocation-free: two atomic loads.
func (e *Endpoint) Load() int64 {
	if el := e.st.engine.Load(); el != nil {
		return max(0, el.Requests+e.st.inflight.Load()-el.Mark)
	}
	return e.st.inflight.Load()
}

// EngineLoad is one scrape of a replica's own metrics.
type EngineLoad struct {
	// Requests is running + waiting as the engine reported them.
	Requests int64
	// KVUsage is the engine's KV-cache usage in [0, 1] (-1: not reported).
	KVUsage float64
	// Mark is DecisionMark() taken just before the scrape was sent.
	Mark int64
}

// StartWindow starts a new recent-decisions window; the scraper calls it at
// every scrape attempt, failed or not, so windows are alike across endpoints.
func (e *Endpoint) StartWindow() {
	e.st.prevWindow.Store(e.st.window.Load())
	e.st.window.Store(e.st.decisions.Load() + e.st.peer.Load() + 1)
}

// NotePeerDecision counts a decision another turnout instance made for this
// endpoint (cluster sync), so placements here even out the requests of
// every instance, not only this one's.
func (e *Endpoint) NotePeerDecision() { e.st.peer.Add(1) }

// recent is the number of decisions made for this endpoint, here and by
// peers, since the last scrape attempt (0 when nothing scrapes): among equally loaded endpoints,
// the one that received fewer requests lately gets a new prompt, so
// placements even out request counts even when requests finish too fast to
// show as load.
func (e *Endpoint) recent() uint64 {
	w := e.st.window.Load() // decisions + 1 at the window start, 0: never
	if w == 0 {
		return 0
	}
	return e.st.decisions.Load() + e.st.peer.Load() + 1 - w
}

// served is the number of decisions made for this endpoint, here and by
// peers, since the previous window started: one to two windows (2-4 s with
// the scraper's defaults), so the bounded-load guard of prefix-affinity
// never starts from nothing when a window turns over. 0 when nothing
// scrapes.
func (e *Endpoint) served() uint64 {
	w := e.st.prevWindow.Load()
	if w == 0 {
		w = e.st.window.Load()
		if w == 0 {
			return 0
		}
	}
	return e.st.decisions.Load() + e.st.peer.Load() + 1 - w
}

// DecisionMark is this endpoint's in-flight count, to pair with a scrape:
// Load adds the change since.
func (e *Endpoint) DecisionMark() int64 { return e.st.inflight.Load() }

// SetEngineLoad publishes a scrape; nil goes back to in-flight counts.
func (e *Endpoint) SetEngineLoad(l *EngineLoad) { e.st.engine.Store(l) }

// Engine returns the last published scrape, or nil.
func (e *Endpoint) Engine() *EngineLoad { return e.st.engine.Load() }

// Available reports whether the endpoint may receive requests.
// A degraded (stalled) or draining (terminating pod) endpoint is not available either.
func (e *Endpoint) Available() bool {
	return !e.Draining && !e.st.down.Load() && !e.st.stall.degraded.Load()
}

// SetDown marks the endpoint down or up (health checks, tests).
func (e *Endpoint) SetDown(down bool) { e.st.down.Store(down) }

// AddInflight adjusts the in-flight count (tests, simulations).
func (e *Endpoint) AddInflight(d int64) { e.st.inflight.Add(d) }

// Pool is an immutable set of endpoints of one role with its policy.
type Pool struct {
	Name       string // HAProxy backend / nginx upstream name
	Deployment string
	Role       string
	PolicyName string
	Endpoints  []*Endpoint
	Policy     Policy
	// blockBytes > 0 when the policy wants prompt block hashes.
	blockBytes int
	// records: the policy learns from other instances' decisions.
	records bool
	nameHdr []byte
	m       *poolMetrics
	// MinReady is how many available endpoints /readyz needs in this pool.
	MinReady int
}

// Deployment is a model deployment with its pools.
type Deployment struct {
	Name   string
	Config *config.DeploymentConfig
	// Serve is the pool that answers (mixed, or decode for PD).
	Serve   *Pool
	Prefill *Pool // PD only
	Pools   []*Pool
}

// Snapshot is one immutable routing configuration, swapped atomically.
type Snapshot struct {
	Config      *config.Config
	Deployments []*Deployment
	byModel     map[string]*Deployment
	sessionHdrs [][]byte // normalized: lower-case, '_' mapped to '-'
	modelHdrs   [][]byte
	// fwdHdrs are ForwardedHeaders, normalized: what an Input keeps;
	// fwdRoles[i] is what fwdHdrs[i] is (headerRole), found once here.
	fwdHdrs  [][]byte
	fwdRoles []hdrRole
	// gen numbers the snapshots of a Server (the header name memo of a
	// pooled scratch is valid for one).
	gen uint64
	// maxBlocks bounds prompt hashing (max_body / smallest block size).
	maxBlocks int
	// byServer finds an endpoint by its (globally unique) server name, for
	// feedback lines; fb is the feedback listener's checks.
	byServer map[string]*Endpoint
	fb       feedbackAuth
}

// Deployment returns the deployment serving model, or nil.
func (s *Snapshot) Deployment(model string) *Deployment { return s.byModel[model] }

// Pools lists every pool in config order.
func (s *Snapshot) Pools() []*Pool {
	var out []*Pool
	for _, d := range s.Deployments {
		out = append(out, d.Pools...)
	}
	return out
}

// stateStore keeps per-endpoint state across snapshots, keyed by pool and name.
type stateStore struct {
	eps   map[string]*endpointState
	pools map[string]*poolMetrics
}

func newStateStore() *stateStore {
	return &stateStore{eps: map[string]*endpointState{}, pools: map[string]*poolMetrics{}}
}

// buildSnapshot turns a validated config into a snapshot, reusing the state
// of endpoints and policies that survive from prev (nil on first load).
func buildSnapshot(cfg *config.Config, reg *Registry, prev *Snapshot, store *stateStore, env PolicyEnv, seed uint64) (*Snapshot, []Policy, error) {
	s := &Snapshot{Config: cfg, byModel: map[string]*Deployment{}, byServer: map[string]*Endpoint{}, fb: newFeedbackAuth(cfg), gen: 1}
	if prev != nil {
		s.gen = prev.gen + 1
	}
	for _, h := range cfg.SessionHeaders {
		s.sessionHdrs = append(s.sessionHdrs, normHeader([]byte(h)))
	}
	for _, h := range cfg.ModelHeaders {
		s.modelHdrs = append(s.modelHdrs, normHeader([]byte(h)))
	}
	for _, h := range ForwardedHeaders(cfg) {
		s.fwdHdrs = append(s.fwdHdrs, normHeader([]byte(h.Name)))
		s.fwdRoles = append(s.fwdRoles, hdrForwarded|s.headerRole(s.fwdHdrs[len(s.fwdHdrs)-1]))
	}
	prevPools := map[string]*Pool{}
	if prev != nil {
		for _, p := range prev.Pools() {
			prevPools[p.Name] = p
		}
	}
	liveEps := map[string]bool{}
	livePools := map[string]bool{}
	var built []Policy
	minBlock := MaxBlockBytes
	for i := range cfg.Deployments {
		dc := &cfg.Deployments[i]
		d := &Deployment{Name: dc.Name, Config: dc}
		for j := range dc.Pools {
			pc := &dc.Pools[j]
			p := &Pool{
				Name:       config.PoolName(dc.Name, pc.Role),
				Deployment: dc.Name,
				Role:       pc.Role,
				MinReady:   cmp.Or(pc.MinReady, cfg.Health.MinReady, 1),
			}
			p.nameHdr = []byte(p.Name)
			livePools[p.Name] = true
			if store.pools[p.Name] == nil {
				store.pools[p.Name] = &poolMetrics{}
			}
			p.m = store.pools[p.Name]
			for k, ec := range pc.Endpoints {
				key := p.Name + "/" + ec.Name
				st := store.eps[key]
				if st == nil {
					st = &endpointState{}
					store.eps[key] = st
				}
				liveEps[key] = true
				ep := &Endpoint{
					Name: ec.Name, Address: ec.Address, KVEvents: ec.KVEvents, KVTopic: ec.KVTopic, KVReplay: ec.KVReplay,
					Index: k, Seed: xxhash.Sum64String(ec.Name), Draining: ec.Draining,
					name: []byte(ec.Name), addr: []byte(ec.Address), st: st,
				}
				if bind, tmpl := cfg.KVBinding(dc, &pc.Endpoints[k]); bind != "" {
					pat, err := kv.CompileTopic(tmpl, ec.Name, ec.Address)
					if err != nil {
						closeAll(built)
						return nil, nil, fmt.Errorf("deployment %q endpoint %q: %w", dc.Name, ec.Name, err)
					}
					ep.KVBind, ep.KVPattern = bind, pat
				}
				p.Endpoints = append(p.Endpoints, ep)
				s.byServer[ec.Name] = ep
			}
			setStallBudget(p, cfg.StallBudget(pc))
			pol := dc.PoolPolicy(pc)
			penv := env
			penv.Pool, penv.Rand = p, NewRand(seed^xxhash.Sum64String(p.Name))
			policy, err := reg.Build(pol, penv)
			if err != nil {
				closeAll(built)
				var ce *config.ConfigError
				if errors.As(err, &ce) {
					return nil, nil, err // already names the field and line
				}
				return nil, nil, fmt.Errorf("deployment %q pool %q: %w", dc.Name, pc.Role, err)
			}
			built = append(built, policy)
			p.Policy = policy
			p.PolicyName = pol.Name
			if pu, ok := policy.(PromptUser); ok {
				p.blockBytes = pu.BlockBytes()
				if p.blockBytes < minBlock {
					minBlock = p.blockBytes
				}
			}
			_, p.records = policy.(PrefixRecorder)
			if st, ok := policy.(Stater); ok {
				if old := prevPools[p.Name]; old != nil {
					st.Carry(old.Policy)
				}
			}
			if st, ok := policy.(Starter); ok {
				st.Start(p)
			}
			d.Pools = append(d.Pools, p)
			switch pc.Role {
			case config.RoleMixed, config.RoleDecode:
				d.Serve = p
			case config.RolePrefill:
				d.Prefill = p
			}
		}
		s.Deployments = append(s.Deployments, d)
		for _, m := range dc.Models {
			s.byModel[m] = d
		}
	}
	s.maxBlocks = cfg.MaxBody/minBlock + 1
	// Removed endpoints lose their state; in-flight decisions still hold a
	// pointer to it, so late completions stay harmless.
	for k := range store.eps {
		if !liveEps[k] {
			delete(store.eps, k)
		}
	}
	for k := range store.pools {
		if !livePools[k] {
			delete(store.pools, k)
		}
	}
	return s, built, nil
}

func closeAll(ps []Policy) {
	for _, p := range ps {
		if c, ok := p.(Closer); ok {
			c.Close()
		}
	}
}

// NormHeader lower-cases a header name and maps '_' to '-': the form
// session and model header names are matched in.
func NormHeader(b []byte) []byte { return normHeader(b) }

// HeaderIs compares a raw header name to a NormHeader'd one without allocating.
func HeaderIs(raw, norm []byte) bool { return headerIs(raw, norm) }

// normHeader lower-cases a header name and maps '_' to '-'.
func normHeader(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = normByte(c)
	}
	return out
}

func normByte(c byte) byte {
	switch {
	case c >= 'A' && c <= 'Z':
		return c + ('a' - 'A')
	case c == '_':
		return '-'
	}
	return c
}
