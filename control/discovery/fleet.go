// Package discovery merges endpoints found at run time (Kubernetes, see
// discovery/kube) into turnout's file config: a burst of changes becomes one
// merged config within a short window, applied through the same path as a
// config reload (route.Decider.Apply keeps surviving endpoints' state); an
// endpoint that disappears stays, draining, until its in-flight decisions
// complete or haproxy.drain_timeout passes; a pool whose slices all vanish
// keeps its last endpoints for discovery.kubernetes.vanish_grace.
package discovery

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/control/discovery/kube"
	"github.com/turnout/turnout/internal/promtext"
)

// DefaultWindow is how long a burst of changes is collected before one swap.
const DefaultWindow = 50 * time.Millisecond

// Source reports discovered endpoints per pool (route.PoolName); a pool it
// does not list is unknown (not synced yet), not empty. Vanished lists the
// pools that have no slice at all (deleted), not merely no ready endpoint.
type Source interface {
	Configure(cfg *config.Config) error
	Endpoints() map[string][]config.EndpointConfig
	Vanished() map[string]bool
	Synced() bool
}

// drainGrace is what the proxies still wait, after the fleet dropped an
// endpoint whose decisions all completed, for its last connections to close
// (the completion line is written as the stream ends).
const drainGrace = time.Second

// Options configure a Fleet.
type Options struct {
	Log *zerolog.Logger
	// Apply takes each merged config (route.Decider.Apply plus proxy sync);
	// synced is false until every source listed its objects once, so
	// proxies are not emptied by a turnout that cannot see the cluster yet.
	// drain is how long the proxies may still wait for the sessions of the
	// servers this merge removes: haproxy.drain_timeout after a file reload
	// (a static endpoint may go), otherwise only what the fleet's own drain
	// left (0 after an expired drain: the wait was spent already).
	Apply func(cfg *config.Config, synced bool, drain time.Duration) error
	// Inflight returns the open decisions of pool's endpoint name.
	Inflight func(pool, name string) int64
	// NewSource builds the Kubernetes source on first need (nil: none).
	NewSource func(notify func()) (Source, error)
	// Window is the debounce window (default 50 ms, at most 100 ms).
	Window time.Duration
}

// gone is an endpoint the source no longer lists, kept draining.
type gone struct {
	ep    config.EndpointConfig
	since time.Time
}

// held is a pool whose EndpointSlices all vanished, kept at its last known
// endpoints until they come back or the grace ends (then over, until the
// slices return).
type held struct {
	eps   []config.EndpointConfig
	since time.Time
	grace time.Duration
	over  bool
}

// Fleet owns the base config and the discovered endpoints.
type Fleet struct {
	opts  Options
	log   *zerolog.Logger
	kick  chan struct{}
	mu    sync.Mutex // serializes merges
	base  *config.Config
	src   Source
	last  map[string][]config.EndpointConfig // per pool, as last applied
	gone  map[string]map[string]gone
	held  map[string]*held // per pool whose slices vanished
	wasOK bool
	// appliedCfg is the last merged config Apply accepted.
	appliedCfg *config.Config
	// changes counts applied membership changes per pool; rejected the
	// merged configs Apply refused (turnout_discovery_* metrics).
	changes  map[poolKey]uint64
	rejected uint64
}

// poolKey labels a discovered pool in metrics.
type poolKey struct{ deployment, pool string }

// New returns a Fleet; Run drives it.
func New(opts Options) *Fleet {
	if opts.Log == nil {
		l := zerolog.Nop()
		opts.Log = &l
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	opts.Window = min(opts.Window, 100*time.Millisecond)
	if opts.Inflight == nil {
		opts.Inflight = func(string, string) int64 { return 0 }
	}
	return &Fleet{opts: opts, log: opts.Log, kick: make(chan struct{}, 1),
		last: map[string][]config.EndpointConfig{}, gone: map[string]map[string]gone{}, held: map[string]*held{}}
}

// Notify marks the discovered state changed; Run merges within the window.
func (f *Fleet) Notify() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// SetBase takes a new file config (start, reload): reconfigures the
// sources and applies the merge at once. On error nothing changes.
func (f *Fleet) SetBase(cfg *config.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cfg.HasDiscovery() {
		if err := kube.Check(cfg); err != nil {
			return err
		}
		if f.src == nil {
			if f.opts.NewSource == nil {
				return fmt.Errorf("%w: discovery configured but not available", config.ErrConfig)
			}
			src, err := f.opts.NewSource(f.Notify)
			if err != nil {
				return fmt.Errorf("discovery: %w", err)
			}
			f.src = src
		}
	}
	if f.src != nil {
		if err := f.src.Configure(cfg); err != nil {
			return err
		}
	}
	prev := f.base
	f.base = cfg
	if err := f.mergeLocked(true); err != nil {
		f.base = prev
		return err
	}
	return nil
}

// Adopt takes cfg, which has no discovery, as the base and as applied
// already: the server was built with it at start, and applying it again
// would count a config reload that did not happen.
func (f *Fleet) Adopt(cfg *config.Config) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.base, f.appliedCfg, f.wasOK = cfg, cfg, true
}

// Run merges after each burst of notifications and re-checks draining
// endpoints until ctx ends.
func (f *Fleet) Run(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
			// One window from the first change: a 50-pod burst is one swap.
			t := time.NewTimer(f.opts.Window)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		case <-tick.C:
			f.mu.Lock()
			n := 0
			for _, g := range f.gone {
				n += len(g)
			}
			for _, h := range f.held {
				if !h.over {
					n++ // its grace may end
				}
			}
			f.mu.Unlock()
			if n == 0 && f.syncedSame() {
				continue
			}
		}
		f.mu.Lock()
		if f.base != nil {
			if err := f.mergeLocked(false); err != nil {
				f.log.Error().Err(err).Msg("discovered endpoints rejected; keeping the previous snapshot")
			}
		}
		f.mu.Unlock()
	}
}

// syncedSame reports whether the source's sync state is what was last applied.
func (f *Fleet) syncedSame() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.src == nil || f.src.Synced() == f.wasOK
}

// mergeLocked builds the merged config and applies it when it changed (or
// force: a new base). Called with f.mu held.
func (f *Fleet) mergeLocked(force bool) error {
	now := time.Now()
	synced := true
	var found map[string][]config.EndpointConfig
	var vanished map[string]bool
	if f.src != nil {
		found = f.src.Endpoints()
		vanished = f.src.Vanished()
		synced = f.src.Synced()
	}
	cfg := *f.base
	cfg.Deployments = slices.Clone(f.base.Deployments)
	drain := f.base.DiscoveryDrain()
	taken := staticNames(f.base)
	next := map[string][]config.EndpointConfig{}
	changed := force || synced != f.wasOK
	var moved []poolKey
	dropped := false // an endpoint whose decisions all completed left
	for i := range cfg.Deployments {
		d := &cfg.Deployments[i]
		d.Pools = slices.Clone(d.Pools)
		for j := range d.Pools {
			p := &d.Pools[j]
			if p.Discovery == nil {
				continue
			}
			pool := config.PoolName(d.Name, p.Role)
			cur, known := found[pool]
			switch {
			case !known:
				cur = f.last[pool] // not synced (yet): keep what we had
			case len(cur) == 0 && vanished[pool] && p.Discovery.Kubernetes != nil:
				cur = f.hold(pool, p.Discovery.Kubernetes.Grace(), now)
			default:
				f.release(pool, len(cur))
			}
			eps := f.withGone(pool, cur, now, drain, &dropped)
			eps = uniqueNames(eps, pool, taken)
			p.Endpoints = eps
			next[pool] = cur
			if !reflect.DeepEqual(eps, f.applied(pool)) {
				changed = true
				moved = append(moved, poolKey{d.Name, pool})
			}
		}
	}
	for pool := range f.held {
		if _, ok := next[pool]; !ok {
			delete(f.held, pool) // the pool left the config
		}
	}
	f.last = next
	if !changed {
		return nil
	}
	// What the proxies still owe the servers this merge removes: a new base
	// may remove static endpoints, and the first synced merge servers the
	// proxies kept from before (a restarted turnout): the full drain; the
	// fleet's other merges remove only endpoints it drained already.
	owed := drain
	if !force && synced == f.wasOK {
		owed = 0
		if dropped {
			owed = min(drainGrace, drain)
		}
	}
	if err := f.opts.Apply(&cfg, synced, owed); err != nil {
		f.rejected++
		return err
	}
	if f.changes == nil {
		f.changes = map[poolKey]uint64{}
	}
	for _, k := range moved {
		f.changes[k]++
	}
	f.wasOK = synced
	f.appliedCfg = &cfg
	f.logPools(&cfg)
	return nil
}

// hold returns what a pool whose slices all vanished keeps: its last
// endpoints while the grace lasts (a Service deleted and re-created gives
// no 503s), nothing once it ended. Endpoints kept stay under health checks,
// which take a replica really gone out of rotation meanwhile.
func (f *Fleet) hold(pool string, grace time.Duration, now time.Time) []config.EndpointConfig {
	h := f.held[pool]
	if h == nil {
		last := f.last[pool]
		if len(last) == 0 || grace <= 0 {
			return nil
		}
		h = &held{eps: slices.Clone(last), since: now, grace: grace}
		f.held[pool] = h
		f.log.Warn().Str("pool", pool).Int("endpoints", len(h.eps)).Dur("grace", grace).
			Msg("every EndpointSlice of the pool (or its InferencePool, or every pod it selected) vanished; keeping its last known endpoints until they return or the grace ends (discovery.kubernetes.vanish_grace)")
	}
	if h.over {
		return nil
	}
	if now.Sub(h.since) >= h.grace {
		h.over = true
		f.log.Warn().Str("pool", pool).Int("endpoints", len(h.eps)).Dur("grace", h.grace).
			Msg("vanish grace over and no EndpointSlice came back; the pool's last known endpoints leave")
		return nil
	}
	return h.eps
}

// release ends a pool's hold: its slices are back (n endpoints).
func (f *Fleet) release(pool string, n int) {
	h := f.held[pool]
	if h == nil {
		return
	}
	delete(f.held, pool)
	if !h.over {
		f.log.Info().Str("pool", pool).Int("endpoints", n).Dur("after", time.Since(h.since)).
			Msg("EndpointSlices (or InferencePool pods) back; the kept endpoints are replaced by what they list")
	}
}

// withGone adds the pool's draining leftovers to cur: endpoints listed last
// time but not now are kept as draining until their in-flight decisions
// are done or the drain timeout passed. done is set when one left with its
// decisions all completed (an expired one leaves it alone).
func (f *Fleet) withGone(pool string, cur []config.EndpointConfig, now time.Time, drain time.Duration, done *bool) []config.EndpointConfig {
	g := f.gone[pool]
	if g == nil {
		g = map[string]gone{}
		f.gone[pool] = g
	}
	present := make(map[string]bool, len(cur))
	for _, e := range cur {
		present[e.Name] = true
		delete(g, e.Name) // back (or never gone)
	}
	for _, e := range f.last[pool] {
		if !present[e.Name] {
			if _, ok := g[e.Name]; !ok {
				e.Draining = true
				g[e.Name] = gone{ep: e, since: now}
			}
		}
	}
	out := slices.Clone(cur)
	for name, ge := range g {
		n := f.opts.Inflight(pool, name)
		if n <= 0 || now.Sub(ge.since) >= drain {
			delete(g, name)
			if n <= 0 {
				*done = true
			}
			f.log.Info().Str("pool", pool).Str("endpoint", name).Int64("inflight", n).
				Dur("drained", now.Sub(ge.since)).Msg("discovered endpoint removed")
			continue
		}
		out = append(out, ge.ep)
	}
	slices.SortFunc(out, func(a, b config.EndpointConfig) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// staticNames are the server names the file's endpoints use.
func staticNames(c *config.Config) map[string]bool {
	m := map[string]bool{}
	for _, d := range c.Deployments {
		for _, p := range d.Pools {
			if p.Discovery == nil {
				for _, e := range p.Endpoints {
					m[e.Name] = true
				}
			}
		}
	}
	return m
}

// uniqueNames keeps server names global: a discovered name already taken
// (a static endpoint, or the same pod name in another pool or namespace)
// gets a hashed form that depends on the pool only, so it is stable too.
func uniqueNames(eps []config.EndpointConfig, pool string, taken map[string]bool) []config.EndpointConfig {
	for i := range eps {
		if taken[eps[i].Name] {
			eps[i].Name = kube.HashedName(pool + "/" + eps[i].Name)
		}
		taken[eps[i].Name] = true
	}
	return eps
}

// applied returns pool's endpoints in the last applied config.
func (f *Fleet) applied(pool string) []config.EndpointConfig {
	if f.appliedCfg == nil {
		return nil
	}
	for _, d := range f.appliedCfg.Deployments {
		for _, p := range d.Pools {
			if config.PoolName(d.Name, p.Role) == pool {
				return p.Endpoints
			}
		}
	}
	return nil
}

func (f *Fleet) logPools(cfg *config.Config) {
	for _, d := range cfg.Deployments {
		for _, p := range d.Pools {
			if p.Discovery == nil {
				continue
			}
			var ready, draining []string
			for _, e := range p.Endpoints {
				if e.Draining {
					draining = append(draining, e.Name)
				} else {
					ready = append(ready, e.Name)
				}
			}
			ev := f.log.Info().Str("pool", config.PoolName(d.Name, p.Role)).Int("n_ready", len(ready)).Int("n_draining", len(draining))
			if len(ready)+len(draining) <= 32 {
				ev = ev.Strs("ready", ready).Strs("draining", draining)
			}
			ev.Msg("discovered pool")
		}
	}
}

// WriteMetrics renders the discovery metrics: whether every watch has
// listed, how many watches are failing right now, membership changes
// applied per pool, merged configs rejected. Without discovery they are
// there too (synced, no watch failing, no change), so a dashboard reads 0
// rather than nothing.
func (f *Fleet) WriteMetrics(b *strings.Builder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	help := promtext.Helper(b)
	on := f.base != nil && f.base.HasDiscovery()
	synced := 0
	if f.wasOK || !on {
		synced = 1
	}
	help("turnout_discovery_synced", "gauge", "1 once every discovery watch has listed its objects (the proxies get discovered endpoints); 1 without discovery.")
	fmt.Fprintf(b, "turnout_discovery_synced %d\n", synced)
	failing := 0
	if fs, ok := f.src.(interface{ Failing() int }); ok && on {
		failing = fs.Failing()
	}
	help("turnout_discovery_watches_failing", "gauge", "Discovery watches whose last list/watch failed (API unreachable, RBAC denied); the last known endpoints stay.")
	fmt.Fprintf(b, "turnout_discovery_watches_failing %d\n", failing)
	if f.base == nil {
		return
	}
	help("turnout_discovery_changes_total", "counter", "Membership changes of a discovered pool applied (scale, rollout, terminating pods); 0 for a pool of configured endpoints.")
	for _, d := range f.base.Deployments {
		for _, p := range d.Pools {
			k := poolKey{d.Name, config.PoolName(d.Name, p.Role)}
			fmt.Fprintf(b, "turnout_discovery_changes_total{deployment=%q,pool=%q} %d\n", k.deployment, k.pool, f.changes[k])
		}
	}
	help("turnout_discovery_rejected_total", "counter", "Merged configs with discovered endpoints that turnout refused (the previous snapshot stays).")
	fmt.Fprintf(b, "turnout_discovery_rejected_total %d\n", f.rejected)
	help("turnout_discovery_held_endpoints", "gauge", "Last known endpoints kept for a pool whose EndpointSlices all vanished, while discovery.kubernetes.vanish_grace lasts (0: the pool follows its slices).")
	for _, d := range f.base.Deployments {
		for _, p := range d.Pools {
			if p.Discovery != nil {
				pool := config.PoolName(d.Name, p.Role)
				n := 0
				if h := f.held[pool]; h != nil && !h.over {
					n = len(h.eps)
				}
				fmt.Fprintf(b, "turnout_discovery_held_endpoints{deployment=%q,pool=%q} %d\n", d.Name, pool, n)
			}
		}
	}
}

// WriteReadiness adds a /readyz?verbose line per pool kept at its last
// known endpoints because its EndpointSlices vanished.
func (f *Fleet) WriteReadiness(b *strings.Builder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pools := make([]string, 0, len(f.held))
	for pool, h := range f.held {
		if !h.over {
			pools = append(pools, pool)
		}
	}
	slices.Sort(pools)
	now := time.Now()
	for _, pool := range pools {
		h := f.held[pool]
		names := make([]string, len(h.eps))
		for i, e := range h.eps {
			names[i] = e.Name
		}
		fmt.Fprintf(b, "discovery: pool %s: every EndpointSlice vanished %v ago; kept at its %d last known endpoints (%s) for %v more (discovery.kubernetes.vanish_grace), unless they fail health\n",
			pool, now.Sub(h.since).Round(time.Millisecond), len(h.eps), strings.Join(names, ","), max(0, h.grace-now.Sub(h.since)).Round(time.Millisecond))
	}
}
