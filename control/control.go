package control

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/control/discovery"
	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/filewatch"
	"github.com/turnout/turnout/nginx"
	"github.com/turnout/turnout/route"
)

// Options configure the loop: where configs come from and which proxies it
// keeps in sync.
type Options struct {
	// ConfigPath is the config file; "" is the embedded default config.
	ConfigPath string
	// Listen overrides the config's listen address.
	Listen string
	// Watch polls the config file for changes this often (0 = SIGHUP only).
	Watch time.Duration
	// HAProxy syncs a rendered HAProxy when Socket or Dir is set; Dir also
	// holds the SPOE agent's default socket, and is created when missing.
	HAProxy haproxy.SyncOptions
	// Nginx re-renders and reloads an nginx when set (Dir is required).
	Nginx *nginx.RenderOptions
	// Kubeconfig for pools with discovery.kubernetes ("" = $KUBECONFIG,
	// else in-cluster).
	Kubeconfig string
	// Version is logged when turnout starts serving.
	Version string
	Log     *zerolog.Logger
	// Check runs on every loaded config (serve: the policy factories), its
	// problems reported with the config's own, all at once.
	Check func(*config.Config) error

	// loaded is the config file as Load found it, the watcher's first look.
	loaded filewatch.Snapshot
}

// Load reads and validates a config the way every reload does: the file (or
// the embedded default) with Check and the served-model check, every
// problem at once, then the Listen override.
func (o *Options) Load(ctx context.Context) (*config.Config, error) {
	var cfg *config.Config
	var err error
	// A model alias a replica would answer 404 for is refused here, at
	// start and on reload, with the config's other problems.
	checks := []func(*config.Config) error{func(c *config.Config) error { return verifyServedModels(ctx, c) }}
	if o.Check != nil {
		checks = append([]func(*config.Config) error{o.Check}, checks...)
	}
	if o.ConfigPath == "" {
		cfg, err = config.ParseConfig(config.DefaultConfigYAML, checks...)
	} else {
		if o.Watch > 0 {
			o.loaded = filewatch.Take(o.ConfigPath) // before the read: a change after it is seen
		}
		cfg, err = config.LoadConfigFile(o.ConfigPath, checks...)
	}
	if err != nil {
		return nil, err
	}
	if o.Listen != "" {
		cfg.Listen = o.Listen
	}
	return cfg, nil
}

// Grace before a replaced listener closes: with a managed proxy, the proxy
// has been synced to the new address and its old workers finish what they
// started; without one the operator moves it, so wait longer.
const syncedGrace, unmanagedGrace = 5 * time.Second, 30 * time.Second

// Loop is the control loop (see the package doc for its goroutines).
type Loop struct {
	opts  Options
	log   *zerolog.Logger
	core  core
	lns   *listeners
	px    *proxies
	fleet *discovery.Fleet
	// rl is the request log (reqlog.go), reopened when request_log changes.
	rl *requestLogs
	// tr is the decision tracer (tracing.go), rebuilt when tracing changes.
	tr *tracers

	// queued are listener changes of applied reloads waiting for the
	// first proxy sync that carries their config (with discovery, the
	// merge once the watches have listed). The loop adds, apply takes.
	mu     sync.Mutex
	queued []*change
}

// New prepares the loop around the decision core: it makes the proxy
// syncers and the HAProxy directory, and opens nothing yet.
func New(srv *route.Decider, opts Options) (*Loop, error) {
	log := opts.Log
	if log == nil {
		l := zerolog.Nop()
		log = &l
	}
	c := newCore(srv)
	lns := newListeners(c, opts.HAProxy.Dir, log)
	px := &proxies{log: log, lns: lns, ch: make(chan syncReq, 1)}
	if opts.HAProxy.Dir != "" {
		// The SPOE socket and the rendered files go there; turnout may be
		// the first to start on a fresh machine.
		if err := os.MkdirAll(opts.HAProxy.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("--haproxy-dir: %w", err)
		}
	}
	if opts.HAProxy.Socket != "" || opts.HAProxy.Dir != "" {
		hs, err := haproxy.NewSyncer(opts.HAProxy, log)
		if err != nil {
			return nil, err
		}
		px.syncers = append(px.syncers, hs)
	}
	if opts.Nginx != nil {
		ns, err := nginx.NewSyncer(nginx.SyncOptions{Render: *opts.Nginx}, log)
		if err != nil {
			return nil, err
		}
		px.syncers = append(px.syncers, ns)
	}
	rl := &requestLogs{log: log, core: c, stdout: os.Stdout, stderr: os.Stderr}
	c.onApply(rl.apply)
	tr := &tracers{log: log, core: c}
	c.onApply(tr.apply)
	c.addMetrics(tr.writeMetrics)
	return &Loop{opts: opts, log: log, core: c, lns: lns, px: px, rl: rl, tr: tr}, nil
}

// Run serves cfg (the config the core was built with) until ctx ends: it
// opens the listeners, hands cfg to the proxies, then takes reloads one at
// a time. On return every listener is closed. An error means turnout could
// not start.
func (l *Loop) Run(ctx context.Context, cfg *config.Config) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	defer l.rl.close()
	defer l.tr.close()
	go l.px.run(ctx)
	l.fleet = newFleet(ctx, l.core, l.opts.Kubeconfig, l.log, l.apply)
	l.core.addMetrics(l.fleet.WriteMetrics) // turnout_discovery_*
	l.core.addReadiness(l.fleet.WriteReadiness)

	ch, err := l.lns.prepare(cfg)
	if err != nil {
		return err
	}
	l.lns.start(ch)
	l.warnNoAgent(cfg) // spoecheck.go
	l.addNoAgentReadiness()
	// Without discovery the core already runs cfg: the proxies get it at
	// once. With discovery, the first merge goes to the proxies once the
	// watches have listed.
	if cfg.HasDiscovery() {
		if err := cli.WithFile(l.fleet.SetBase(cfg), l.opts.ConfigPath); err != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l.lns.shutdown(sctx)
			return err
		}
	} else {
		l.fleet.Adopt(cfg)
		if l.px.managed() {
			l.px.push(cfg, nil)
		}
	}
	go l.fleet.Run(ctx)
	changed := make(chan struct{}, 1)
	if l.opts.ConfigPath != "" && l.opts.Watch > 0 {
		go filewatch.Poll(ctx, l.opts.ConfigPath, l.opts.Watch, l.opts.loaded, func() {
			select { // a reload already pending reads the newest file
			case changed <- struct{}{}:
			default:
			}
		})
	}
	l.log.Info().Str("listen", cfg.Listen).Int("deployments", len(cfg.Deployments)).Str("version", l.opts.Version).Msg("turnout serving")
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l.lns.shutdown(sctx)
			return nil
		case <-hup:
			l.reload(ctx, "SIGHUP")
		case <-changed:
			l.reload(ctx, "file changed")
		}
	}
}

// Serve is Run with the core's own loops beside it (core.go, startLoops):
// what turnout serve runs. It returns when Run does, after the cluster's
// last batch is flushed.
func (l *Loop) Serve(ctx context.Context, cfg *config.Config) error {
	ctx, cancel := context.WithCancel(ctx)
	wait, err := l.core.startLoops(ctx, cfg, l.log)
	if err != nil {
		cancel()
		return err
	}
	defer func() { cancel(); wait() }()
	return l.Run(ctx, cfg)
}

// apply is the one way a config reaches the core (the fleet calls it with
// each merge, reloads through SetBase). Once discovery has listed
// everything (synced), the proxies get the config, with the listener
// changes of the reloads it carries; drain is how long they may still wait
// for the sessions of the servers it removes (the fleet drained discovered
// endpoints already, so an expired drain does not hold the next sync).
func (l *Loop) apply(c *config.Config, synced bool, drain time.Duration) error {
	if err := l.core.apply(c); err != nil {
		return err
	}
	if synced && l.px.managed() {
		pc := c
		if drain != c.HAProxy.DrainTimeout.D() {
			cp := *c
			cp.HAProxy.DrainTimeout = config.Duration(drain)
			pc = &cp
		}
		l.mu.Lock()
		queued := l.queued
		l.queued = nil
		l.mu.Unlock()
		l.px.push(pc, nil)
		for _, ch := range queued {
			l.px.push(pc, ch)
		}
	}
	return nil
}

// reload takes the config source's current config, or keeps the running
// one and says why not. why is the trigger, logged with the outcome.
func (l *Loop) reload(ctx context.Context, why string) {
	reject := func(err error) {
		l.core.rejected()
		l.log.Error().Err(err).Str("trigger", why).Msg("config rejected; keeping the previous one")
	}
	c, err := l.opts.Load(ctx)
	if err != nil {
		reject(err)
		return
	}
	// Listeners first: a config naming an address turnout cannot bind is
	// rejected whole, and no proxy is pointed at it.
	ch, err := l.lns.prepare(c)
	if err != nil {
		reject(err)
		return
	}
	if l.px.managed() {
		l.mu.Lock()
		l.queued = append(l.queued, ch)
		l.mu.Unlock()
	}
	if err := cli.WithFile(l.fleet.SetBase(c), l.opts.ConfigPath); err != nil {
		l.mu.Lock()
		if i := slices.Index(l.queued, ch); i >= 0 {
			l.queued = slices.Delete(l.queued, i, i+1)
		}
		l.mu.Unlock()
		l.lns.abort(ch)
		l.log.Error().Err(err).Str("trigger", why).Msg("config rejected; keeping the previous one")
		return
	}
	l.lns.start(ch)
	l.log.Info().Str("trigger", why).Int("deployments", len(c.Deployments)).Strs("listeners_changed", ch.fields).Msg("config reloaded")
	cli.LogWarnings(l.log, l.opts.ConfigPath, c)
	l.warnNoAgent(c)
	if !l.px.managed() && len(ch.replace) > 0 {
		l.log.Warn().Strs("fields", ch.fields).Dur("grace", unmanagedGrace).Msg("listener address changed and no proxy is managed: point the proxy at the new address; the old listener closes after the grace")
		l.lns.retire(ch, unmanagedGrace, c.Proxy.StreamTimeout.D())
	}
}
