package main

import (
	"github.com/turnout/turnout/route/feedback"

	"github.com/turnout/turnout/route/health"

	"context"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/filewatch"
	"github.com/turnout/turnout/internal/procmetrics"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/cluster"
	"github.com/turnout/turnout/route/engineload"
	"github.com/turnout/turnout/route/policy"
)

// syncer pushes accepted configs to a proxy (HAProxy runtime API).
type syncer interface {
	Sync(ctx context.Context, cfg *config.Config) error
}

func runServe(args []string, log *zerolog.Logger) error {
	fs := newFlags("serve")
	cfgPath := fs.String("config", "", "config file (default: embedded default config)")
	listen := fs.String("listen", "", "override the config's listen address")
	level := fs.String("log-level", "", "log level (debug, info, warn, error)")
	watch := fs.Duration("watch", time.Second, "poll the config file for changes this often (0 = only SIGHUP)")
	// HAProxy sync (issue 3)
	haSocket := fs.String("haproxy-socket", "", "HAProxy admin socket; enables pool sync (default haproxy.stats_socket, else DIR/admin.sock)")
	haDir := fs.String("haproxy-dir", "", "directory of the rendered HAProxy files; enables pool sync and the SPOE agent on DIR/spoe.sock (default haproxy.dir)")
	haPID := fs.String("haproxy-pidfile", "", "HAProxy master pidfile, for reloads (default DIR/haproxy.pid)")
	// nginx sync (issue 5)
	ngx := addNginxFlags(fs, "directory of the rendered nginx files; enables nginx sync (re-render + reload)")
	// Kubernetes discovery (issue 10)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for pools with discovery.kubernetes (default $KUBECONFIG, else in-cluster)")
	if err := parseFlags(fs, serveCmd, args); err != nil {
		return err
	}
	if *level != "" {
		if lvl, err := zerolog.ParseLevel(*level); err == nil {
			l := log.Level(lvl)
			log = &l
		}
	}
	load := func() (*config.Config, error) {
		var cfg *config.Config
		var err error
		if *cfgPath == "" {
			cfg, err = config.ParseConfig(config.DefaultConfigYAML)
		} else {
			cfg, err = config.LoadConfigFile(*cfgPath)
		}
		if err != nil {
			return nil, err
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
		// A model alias a replica would answer 404 for is refused here,
		// at start and on reload (route/health/modelverify.go).
		if err := health.VerifyServedModels(context.Background(), cfg, nil); err != nil {
			return nil, withFile(err, *cfgPath)
		}
		return cfg, nil
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	logWarnings(log, *cfgPath, cfg)
	srv, err := route.New(cfg, route.Options{Registry: policy.DefaultRegistry(), Log: log})
	if err != nil {
		return withFile(err, *cfgPath)
	}
	defer srv.Close() // stops KV-event subscriptions
	// turnout_build_info, go_*, process_*: gathered at scrape time only.
	if pm, err := procmetrics.New(version); err != nil {
		log.Warn().Err(err).Msg("process metrics unavailable")
	} else {
		srv.AddMetrics(pm.WriteMetrics)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var syncers []syncer
	// HAProxy sync (issue 3): construct syncers here.
	if *haSocket != "" || *haDir != "" {
		hs, err := haproxy.NewSyncer(haproxy.SyncOptions{Socket: *haSocket, Dir: *haDir, PIDFile: *haPID}, log)
		if err != nil {
			return err
		}
		syncers = append(syncers, hs)
	}
	// nginx sync (issue 5)
	if ns, err := ngx.syncer(log); err != nil {
		return err
	} else if ns != nil {
		syncers = append(syncers, ns)
	}

	// Syncs run in one goroutine, newest config wins, so a slow drain never
	// blocks the decision path or piles up. A sync carries the listeners it
	// makes obsolete: they close only after the proxies moved away from them.
	type syncReq struct {
		cfg     *config.Config
		retired []*change
	}
	syncCh := make(chan syncReq, 1)
	pushSync := func(c *config.Config, ch *change) {
		req := syncReq{cfg: c}
		select {
		case old := <-syncCh:
			req.retired = old.retired
		default:
		}
		if ch != nil {
			req.retired = append(req.retired, ch)
		}
		syncCh <- req
	}
	// Completion feedback: read by the feedback listener, checked on every tick of srv.Run.
	fb := feedback.New(srv)
	lns := newListeners(srv, fb, log)
	lns.spoeAddr = spoeAddrFunc(*haDir)
	// Grace before an old listener closes: the proxies have been reloaded
	// toward the new address; their old workers finish what they started.
	// Without a managed proxy the operator moves it, so wait longer.
	const syncedGrace, unmanagedGrace = 5 * time.Second, 30 * time.Second
	var pending []*change // replaced listeners kept while the proxy sync fails
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case req := <-syncCh:
				// The proxies sync side by side: an nginx reload (or an
				// HAProxy drain) does not hold the other proxy's pool
				// change back (Kubernetes scale-ups, issue 10).
				var (
					failed atomic.Bool
					wg     sync.WaitGroup
				)
				for _, s := range syncers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := s.Sync(ctx, req.cfg); err != nil {
							failed.Store(true)
							log.Error().Err(err).Msg("proxy sync failed")
						}
					}()
				}
				wg.Wait()
				pending = append(pending, req.retired...)
				if failed.Load() && len(pending) > 0 {
					log.Warn().Msg("proxy sync failed: replaced listeners stay open until a sync succeeds")
					continue
				}
				for _, ch := range pending {
					lns.retire(ch, syncedGrace, req.cfg.Proxy.StreamTimeout.D())
				}
				pending = nil
			}
		}
	}()
	// Kubernetes discovery (issue 10): every config goes through the fleet,
	// which merges discovered endpoints in and applies like a reload. The
	// proxies get the merged config once discovery has listed everything
	// (an unsynced turnout must not empty them); a reload's listener change
	// rides on the next such sync.
	var (
		chMu     sync.Mutex
		chQueued []*change
	)
	fleet := newFleet(ctx, srv, *kubeconfig, log, func(c *config.Config, synced bool) error {
		if err := srv.Apply(c); err != nil {
			return err
		}
		if synced && len(syncers) > 0 {
			chMu.Lock()
			queued := chQueued
			chQueued = nil
			chMu.Unlock()
			pushSync(c, nil)
			for _, ch := range queued {
				pushSync(c, ch)
			}
		}
		return nil
	})

	var reloadMu sync.Mutex // SIGHUP and the file watch may fire together
	reload := func(why string) {
		reloadMu.Lock()
		defer reloadMu.Unlock()
		c, err := load()
		if err != nil {
			srv.Rejected()
			log.Error().Err(err).Str("trigger", why).Msg("config rejected; keeping the previous one")
			return
		}
		// Listeners first: a config naming an address turnout cannot bind
		// is rejected whole, and no proxy is pointed at it.
		ch, err := lns.prepare(c)
		if err != nil {
			srv.Rejected()
			log.Error().Err(err).Str("trigger", why).Msg("config rejected; keeping the previous one")
			return
		}
		if len(syncers) > 0 {
			chMu.Lock()
			chQueued = append(chQueued, ch)
			chMu.Unlock()
		}
		if err := withFile(fleet.SetBase(c), *cfgPath); err != nil {
			chMu.Lock()
			if i := slices.Index(chQueued, ch); i >= 0 {
				chQueued = slices.Delete(chQueued, i, i+1)
			}
			chMu.Unlock()
			lns.abort(ch)
			log.Error().Err(err).Str("trigger", why).Msg("config rejected; keeping the previous one")
			return
		}
		lns.start(ch)
		log.Info().Str("trigger", why).Int("deployments", len(c.Deployments)).Strs("listeners_changed", ch.fields).Msg("config reloaded")
		logWarnings(log, *cfgPath, c)
		if len(syncers) == 0 && len(ch.replace) > 0 {
			log.Warn().Strs("fields", ch.fields).Dur("grace", unmanagedGrace).Msg("listener address changed and no proxy is managed: point the proxy at the new address; the old listener closes after the grace")
			lns.retire(ch, unmanagedGrace, c.Proxy.StreamTimeout.D())
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go srv.Run(ctx)
	hc := health.New(srv)
	go hc.Run(ctx)
	// Warn about model aliases a replica would answer 404 for (route/health/modelcheck.go).
	go hc.CheckServedModels(ctx, 30*time.Second)
	// Engine-reported load (issue 11): scrapes every endpoint's /metrics.
	scraper := engineload.New(srv, log)
	srv.AddMetrics(scraper.WriteMetrics)
	go scraper.Run(ctx)
	// Shared prefix view (issue 11): cluster settings are read at start.
	if cfg.Cluster.Enabled() {
		cs, err := cluster.New(srv, cfg.Cluster, log)
		if err != nil {
			return err
		}
		srv.AddMetrics(cs.WriteMetrics)
		go cs.Run(ctx)
		defer func() { stop(); cs.Wait() }() // flushes the last batch
		log.Info().Str("cluster", cfg.Cluster.String()).Msg("cluster prefix sharing on")
	}

	ch, err := lns.prepare(cfg)
	if err != nil {
		return err
	}
	lns.start(ch)
	if lns.spoeAddr(cfg) == "" && cfg.HAProxy.Path == config.HAProxyPathSPOE {
		// An HAProxy rendered for this config would find no agent and fail open.
		log.Info().Msg("no SPOE agent: give --haproxy-dir (or haproxy.dir, or haproxy.spoe) when HAProxy routes through turnout")
	}
	// Without discovery the server already runs cfg: the proxies get it at
	// once. With discovery, the first merge goes to the proxies once the
	// watches have listed.
	if cfg.HasDiscovery() {
		if err := withFile(fleet.SetBase(cfg), *cfgPath); err != nil {
			return err
		}
	} else {
		fleet.Adopt(cfg)
		if len(syncers) > 0 {
			pushSync(cfg, nil)
		}
	}
	go fleet.Run(ctx)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload("SIGHUP")
			}
		}
	}()
	if *cfgPath != "" && *watch > 0 {
		go filewatch.Poll(ctx, *cfgPath, *watch, func() { reload("file changed") })
	}
	log.Info().Str("listen", cfg.Listen).Int("deployments", len(cfg.Deployments)).Str("version", version).Msg("turnout serving")
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lns.shutdown(sctx)
	return nil
}
