package route

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/kvtopic"

	"github.com/cespare/xxhash/v2"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/feeds"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/flow"
	"github.com/turnout/turnout/route/models"
	"github.com/turnout/turnout/route/policy"
)

// Deployment is a model deployment with its pools.
type Deployment struct {
	Name   string
	Config *config.DeploymentConfig
	// Serve is the pool that answers (mixed, or decode for PD).
	Serve   *fleet.Pool
	Prefill *fleet.Pool // PD only
	Pools   []*fleet.Pool
	// Passes are the picks a decision makes, in order (decide.go): the
	// serving pool's, then for prefill/decode the prefill pool's.
	Passes []Pass
	// flow holds decisions while Serve is saturated (route/flow); nil: off.
	flow *flow.Controller
	// pickN is how many endpoints each pass picks (1 + fallbacks, within
	// a Txn's picks shared by the passes).
	pickN int
}

// Snapshot is one immutable routing configuration, swapped atomically.
type Snapshot struct {
	Config      *config.Config
	Deployments []*Deployment
	byModel     map[string]modelRef
	// models routes every model name, adapters included, to its endpoints
	// (route/models); rebuilt when what endpoints serve changes. deps are
	// its view of the deployments, parallel to Deployments.
	models      atomic.Pointer[models.Table]
	deps        []models.Dep
	sessionHdrs [][]byte // normalized: lower-case, '_' mapped to '-'
	modelHdrs   [][]byte
	// flowHdrs are the headers flow control reads, normalized (nil: not
	// read: untrusted, or no deployment has flow_control); every
	// deployment with flow_control reads the same (config checks it).
	flowPrio, flowTenant, flowAuthz, flowSLO []byte
	// fwdHdrs are ForwardedHeaders, normalized: what an Input keeps;
	// fwdRoles[i] is what fwdHdrs[i] is (headerRole), found once here.
	fwdHdrs  [][]byte
	fwdRoles []hdrRole
	// gen numbers the snapshots of a Decider (the header name memo of a
	// pooled scratch is valid for one).
	gen uint64
	// maxBlocks bounds prompt hashing (max_body / smallest block size).
	maxBlocks int
	// byServer finds an endpoint by its (globally unique) server name, for
	// feedback lines; fb is the feedback listener's checks.
	byServer map[string]*fleet.Endpoint
	byAddr   map[string]*fleet.Endpoint
	fb       feedbackAuth
}

// Deployment returns the deployment serving model, or nil.
func (s *Snapshot) Deployment(model string) *Deployment { return s.byModel[model].d }

// modelRef is a configured model name's deployment.
type modelRef struct {
	d *Deployment
}

// Pools lists every pool in config order.
func (s *Snapshot) Pools() []*fleet.Pool {
	var out []*fleet.Pool
	for _, d := range s.Deployments {
		out = append(out, d.Pools...)
	}
	return out
}

// stateStore keeps per-endpoint state across snapshots, keyed by pool and name.
type stateStore struct {
	eps   map[string]*fleet.State
	pools map[string]*fleet.PoolMetrics
}

func newStateStore() *stateStore {
	return &stateStore{eps: map[string]*fleet.State{}, pools: map[string]*fleet.PoolMetrics{}}
}

// buildSnapshot turns a validated config into a snapshot, reusing the state
// of endpoints and policies that survive from prev (nil on first load).
func buildSnapshot(cfg *config.Config, reg *policy.Registry, prev *Snapshot, store *stateStore, env fleet.PolicyEnv, seed uint64) (*Snapshot, []fleet.Policy, error) {
	s := &Snapshot{Config: cfg, byModel: map[string]modelRef{}, byServer: map[string]*fleet.Endpoint{}, byAddr: map[string]*fleet.Endpoint{}, fb: newFeedbackAuth(cfg), gen: 1}
	if prev != nil {
		s.gen = prev.gen + 1
	}
	for _, h := range cfg.SessionHeaders {
		s.sessionHdrs = append(s.sessionHdrs, contract.NormHeader([]byte(h)))
	}
	for _, h := range cfg.ModelHeaders {
		s.modelHdrs = append(s.modelHdrs, contract.NormHeader([]byte(h)))
	}
	for i := range cfg.Deployments {
		if fc := cfg.Deployments[i].FlowControl; fc != nil {
			if fc.Trust.PriorityHeader {
				s.flowPrio = contract.NormHeader([]byte(fc.PriorityHeader))
			}
			if fc.Trust.TenantHeader {
				s.flowTenant = contract.NormHeader([]byte(fc.TenantHeader))
			}
			if fc.Trust.SLOHeader {
				s.flowSLO = contract.NormHeader([]byte(fc.SLOHeader))
			}
			if fc.TenantAPIKey {
				s.flowAuthz = contract.NormHeader([]byte(contract.FwdAuthorization))
			}
		}
	}
	for _, h := range contract.ForwardedHeaders(cfg) {
		s.fwdHdrs = append(s.fwdHdrs, contract.NormHeader([]byte(h.Name)))
		s.fwdRoles = append(s.fwdRoles, hdrForwarded|s.headerRole(s.fwdHdrs[len(s.fwdHdrs)-1]))
	}
	prevPools := map[string]*fleet.Pool{}
	if prev != nil {
		for _, p := range prev.Pools() {
			prevPools[p.Name] = p
		}
	}
	liveEps := map[string]bool{}
	livePools := map[string]bool{}
	var built []fleet.Policy
	minBlock := fleet.MaxBlockBytes
	for i := range cfg.Deployments {
		dc := &cfg.Deployments[i]
		d := &Deployment{Name: dc.Name, Config: dc}
		for j := range dc.Pools {
			pc := &dc.Pools[j]
			p := &fleet.Pool{
				Name:       config.PoolName(dc.Name, pc.Role),
				Deployment: dc.Name,
				Role:       pc.Role,
				MinReady:   cfg.PoolMinReady(pc),
			}
			p.NameHdr = []byte(p.Name)
			livePools[p.Name] = true
			if store.pools[p.Name] == nil {
				store.pools[p.Name] = &fleet.PoolMetrics{}
			}
			p.Metrics = store.pools[p.Name]
			for k, ec := range pc.Endpoints {
				key := p.Name + "/" + ec.Name
				st := store.eps[key]
				if st == nil {
					st = &fleet.State{}
					store.eps[key] = st
				}
				liveEps[key] = true
				ep := &fleet.Endpoint{
					Name: ec.Name, Address: ec.Address, KVEvents: ec.KVEvents, KVTopic: ec.KVTopic, KVReplay: ec.KVReplay,
					Index: k, Seed: xxhash.Sum64String(ec.Name), Draining: ec.Draining,
					NameHdr: []byte(ec.Name), AddrHdr: []byte(ec.Address), State: st,
				}
				if bind, tmpl := cfg.KVBinding(dc, &pc.Endpoints[k]); bind != "" {
					pat, err := kvtopic.Compile(tmpl, ec.Name, ec.Address)
					if err != nil {
						closeAll(built)
						return nil, nil, fmt.Errorf("deployment %q endpoint %q: %w", dc.Name, ec.Name, err)
					}
					ep.KVBind, ep.KVPattern = bind, pat
				}
				pinModels(ep, dc, pc, &pc.Endpoints[k])
				p.Endpoints = append(p.Endpoints, ep)
				s.byServer[ec.Name] = ep
				if s.byAddr[ec.Address] == nil {
					s.byAddr[ec.Address] = ep
				}
			}
			setStallBudget(p, cfg.StallBudget(pc))
			pol := dc.PoolPolicy(pc)
			penv := env
			penv.Pool, penv.Rand = p, fleet.NewRand(seed^xxhash.Sum64String(p.Name))
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
			if pu, ok := policy.(fleet.PromptUser); ok {
				p.BlockBytes = pu.BlockBytes()
				if p.BlockBytes < minBlock {
					minBlock = p.BlockBytes
				}
			}
			_, p.Records = policy.(fleet.PrefixRecorder)
			if st, ok := policy.(fleet.Stater); ok {
				if old := prevPools[p.Name]; old != nil {
					st.Carry(old.Policy)
				}
			}
			if st, ok := policy.(fleet.Starter); ok {
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
		d.Passes = append(d.Passes, Pass{Pool: d.Serve, Role: PassServe})
		if d.Prefill != nil {
			d.Passes = append(d.Passes, Pass{Pool: d.Prefill, Role: PassPrefill})
		}
		d.pickN = min(1+cfg.Fallbacks, maxPicks/len(d.Passes))
		s.Deployments = append(s.Deployments, d)
		for _, m := range dc.Models {
			s.byModel[m] = modelRef{d}
		}
		md := models.Dep{Config: dc}
		for _, pr := range d.Passes {
			md.Pools = append(md.Pools, pr.Pool)
		}
		s.deps = append(s.deps, md)
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

func closeAll(ps []fleet.Policy) {
	for _, p := range ps {
		if c, ok := p.(fleet.Closer); ok {
			c.Close()
		}
	}
}

// CheckPolicies builds every pool's policy from cfg without starting any
// (no KV-event subscriptions, no network), so `turnout render` reports bad
// policy names and params, with their lines, before a proxy is configured.
func CheckPolicies(cfg *config.Config, reg *policy.Registry) error {
	if reg == nil {
		reg = policy.DefaultRegistry()
	}
	var errs []error
	for i := range cfg.Deployments {
		dc := &cfg.Deployments[i]
		for j := range dc.Pools {
			pc := &dc.Pools[j]
			p := &fleet.Pool{Name: config.PoolName(dc.Name, pc.Role), Deployment: dc.Name, Role: pc.Role}
			for k, ec := range pc.Endpoints {
				p.Endpoints = append(p.Endpoints, &fleet.Endpoint{Name: ec.Name, Address: ec.Address, KVEvents: ec.KVEvents, Index: k})
			}
			pol, err := reg.Build(dc.PoolPolicy(pc), fleet.PolicyEnv{Pool: p, Rand: fleet.NewRand(1)})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, w := range feeds.Warnings(cfg, i, j, pol) {
				cfg.AddWarning(w)
			}
			closeAll([]fleet.Policy{pol})
		}
	}
	if ce := config.AsError(errs); ce != nil {
		return ce
	}
	return nil
}

// feedbackAuth is a snapshot's view of who may send feedback.
type feedbackAuth struct {
	sources []netip.Prefix
	// token guards the feedback lines, doneToken /internal/done (only an
	// explicit feedback.token: config.FeedbackConfig.LineToken says why).
	token, doneToken []byte
}

func newFeedbackAuth(cfg *config.Config) feedbackAuth {
	a := feedbackAuth{}
	if t := cfg.Feedback.LineToken(); t != "" {
		a.token = []byte(t)
	}
	if cfg.Feedback.Token != "" {
		a.doneToken = []byte(cfg.Feedback.Token)
	}
	for _, src := range cfg.Feedback.Sources {
		if p, err := config.ParsePrefix(src); err == nil {
			a.sources = append(a.sources, p)
		}
	}
	return a
}

// FeedbackAllowed reports whether src may send completion feedback
// (feedback.sources).
func (s *Snapshot) FeedbackAllowed(src netip.Addr) bool { return s.fb.allowed(src) }

// FeedbackToken is the token feedback lines must carry (nil: none).
func (s *Snapshot) FeedbackToken() []byte { return s.fb.token }

// DoneToken is the token /internal/done calls must carry (nil: none).
func (s *Snapshot) DoneToken() []byte { return s.fb.doneToken }

func (a *feedbackAuth) allowed(src netip.Addr) bool {
	src = src.Unmap()
	for _, p := range a.sources {
		if p.Contains(src) {
			return true
		}
	}
	return false
}

// PoolByName returns the snapshot's pool with that name, or nil.
func (s *Snapshot) PoolByName(name string) *fleet.Pool {
	for _, d := range s.Deployments {
		for _, p := range d.Pools {
			if p.Name == name {
				return p
			}
		}
	}
	return nil
}

// forwarded reports whether the raw header name is one of ForwardedHeaders.
func (s *Snapshot) forwarded(name []byte) bool { return s.forwardedRole(name) != 0 }

// forwardedRole is the role of the raw header name when it is one of
// ForwardedHeaders, else 0.
func (s *Snapshot) forwardedRole(name []byte) hdrRole {
	for i, f := range s.fwdHdrs {
		if contract.HeaderIs(name, f) {
			return s.fwdRoles[i]
		}
	}
	return 0
}

// Forwarded is forwarded for the transports outside this package.
func (s *Snapshot) Forwarded(name []byte) bool { return s.forwarded(name) }

// ForwardedRole is what the raw header name is to the decision (0: not
// forwarded), for a transport's contract.Input.AddHeaderRole: the name
// is matched once, where the transport reads it.
func (s *Snapshot) ForwardedRole(name []byte) uint8 { return uint8(s.forwardedRole(name)) }

// setStallBudget applies a pool's budget to its endpoints; an endpoint whose
// detection is turned off is no longer held degraded.
func setStallBudget(p *fleet.Pool, budget time.Duration) {
	for _, e := range p.Endpoints {
		e.State.Stall.BudgetNs.Store(int64(budget))
		if budget <= 0 {
			e.State.Stall.Degraded.Store(false)
		}
	}
}

// EndpointByServer finds an endpoint by its (globally unique) server name,
// as a feedback line names it; nil when none.
func (s *Snapshot) EndpointByServer(name []byte) *fleet.Endpoint { return s.byServer[string(name)] }

// EndpointByAddr finds an endpoint by its address (the first in config
// order when several pools share one), for a feedback line whose proxy
// names the replica that answered only by address (nginx, after a retry).
func (s *Snapshot) EndpointByAddr(addr []byte) *fleet.Endpoint { return s.byAddr[string(addr)] }

// pinModels publishes what the config pins for an endpoint (its own or its
// pool's models:), and forgets an earlier pin the config dropped, so that
// the endpoint's list is learned again.
func pinModels(ep *fleet.Endpoint, dc *config.DeploymentConfig, pc *config.PoolConfig, ec *config.EndpointConfig) {
	pin := config.PinnedModels(pc, ec)
	if pin == nil {
		if old := ep.ServedModels(); old != nil && old.Source != fleet.ModelsListed {
			ep.SetServed(nil)
		}
		return
	}
	if ec.Discovered && ec.Models != nil {
		// A pod label names its base model; the replica's own list, once
		// polled, says more (its adapters) and stays.
		if old := ep.ServedModels(); old == nil || old.Source != fleet.ModelsListed {
			ep.SetServed(&fleet.ServedModels{Source: fleet.ModelsLabels, Models: []fleet.ServedModel{{ID: pin[0]}}})
		}
		return
	}
	sm := &fleet.ServedModels{Source: fleet.ModelsPinned}
	for _, m := range pin {
		parent := ""
		if !slices.Contains(dc.Models, m) {
			parent = dc.Models[0] // a pinned name beyond the deployment's models is its adapter
		}
		sm.Models = append(sm.Models, fleet.ServedModel{ID: m, Parent: parent})
	}
	ep.SetServed(sm)
}

// Models is the snapshot's model table (route/models).
func (s *Snapshot) Models() *models.Table { return s.models.Load() }

// ModelDeps is the table's view of the deployments, parallel to Deployments.
func (s *Snapshot) ModelDeps() []models.Dep { return s.deps }
