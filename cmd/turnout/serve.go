package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/cluster"
	"github.com/turnout/turnout/route/engineload"
)

// syncer pushes accepted configs to a proxy (HAProxy runtime API).
type syncer interface {
	Sync(ctx context.Context, cfg *route.Config) error
}

func runServe(args []string, log *zerolog.Logger) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file (default: embedded default config)")
	listen := fs.String("listen", "", "override the config's listen address")
	level := fs.String("log-level", "", "log level (debug, info, warn, error)")
	watch := fs.Duration("watch", time.Second, "poll the config file for changes this often (0 = only SIGHUP)")
	// HAProxy sync (issue 3)
	haSocket := fs.String("haproxy-socket", "", "HAProxy admin socket; enables pool sync (default haproxy.stats_socket, else DIR/admin.sock)")
	haDir := fs.String("haproxy-dir", "", "directory of the rendered HAProxy files; enables pool sync (default haproxy.dir)")
	haPID := fs.String("haproxy-pidfile", "", "HAProxy master pidfile, for reloads (default DIR/haproxy.pid)")
	// nginx sync (issue 5)
	ngx := addNginxFlags(fs, "directory of the rendered nginx files; enables nginx sync (re-render + reload)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("serve flags: %w", err)
	}
	if *level != "" {
		if lvl, err := zerolog.ParseLevel(*level); err == nil {
			l := log.Level(lvl)
			log = &l
		}
	}
	load := func() (*route.Config, error) {
		var cfg *route.Config
		var err error
		if *cfgPath == "" {
			cfg, err = route.ParseConfig(route.DefaultConfigYAML)
		} else {
			cfg, err = route.LoadConfigFile(*cfgPath)
		}
		if err != nil {
			return nil, err
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
		return cfg, nil
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	srv, err := route.NewServer(cfg, route.Options{Registry: route.DefaultRegistry(), Log: log})
	if err != nil {
		return err
	}
	defer srv.Close() // stops KV-event subscriptions
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
	// blocks the decision path or piles up.
	syncCh := make(chan *route.Config, 1)
	pushSync := func(c *route.Config) {
		select {
		case <-syncCh:
		default:
		}
		syncCh <- c
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case c := <-syncCh:
				for _, s := range syncers {
					if err := s.Sync(ctx, c); err != nil {
						log.Error().Err(err).Msg("proxy sync failed")
					}
				}
			}
		}
	}()
	if len(syncers) > 0 {
		pushSync(cfg)
	}

	reload := func(why string) {
		c, err := load()
		if err != nil {
			srv.Rejected()
		} else {
			err = srv.Apply(c)
		}
		if err != nil {
			log.Error().Err(err).Str("trigger", why).Msg("config rejected; keeping the previous one")
			return
		}
		log.Info().Str("trigger", why).Int("deployments", len(c.Deployments)).Msg("config reloaded")
		if len(syncers) > 0 {
			pushSync(c)
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
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
		go route.WatchFile(ctx, *cfgPath, *watch, func() { reload("file changed") })
	}
	go srv.Run(ctx)
	go srv.RunHealth(ctx)
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
	if a := cfg.HAProxy.SPOE; a != "" {
		if err := startSPOE(ctx, a, srv, log); err != nil {
			return err
		}
	}
	if a := cfg.Feedback.Syslog; a != "" {
		go func() {
			if err := srv.ListenFeedback(ctx, a); err != nil {
				log.Error().Err(err).Msg("feedback listener")
			}
		}()
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	hs := srv.NewHTTPServer()
	errCh := make(chan error, 1)
	go func() { errCh <- hs.Serve(ln) }()
	log.Info().Str("listen", cfg.Listen).Int("deployments", len(cfg.Deployments)).Str("version", version).Msg("turnout serving")
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.ShutdownWithContext(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("shutdown: %w", err)
		}
		return nil
	case err := <-errCh:
		return fmt.Errorf("serve: %w", err)
	}
}
