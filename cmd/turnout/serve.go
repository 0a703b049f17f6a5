package main

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/control"
	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/internal/procmetrics"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/policy"
)

// runServe wires turnout serve: flags, the decision core, and the control
// loop (control), which runs it and its loops until SIGINT/SIGTERM.
func runServe(args []string, log *zerolog.Logger) error {
	fs := cli.NewFlags("serve")
	cfgPath := fs.String("config", "", "config `FILE` (default: embedded default config)")
	listen := fs.String("listen", "", "override the config's listen address (`ADDR`)")
	level := fs.String("log-level", "", "log level (debug, info, warn, error)")
	watch := fs.Duration("watch", time.Second, "poll the config file for changes this often (0 = only SIGHUP)")
	// HAProxy sync
	haSocket := fs.String("haproxy-socket", "", "HAProxy admin socket `PATH`; enables pool sync (default haproxy.stats_socket, else DIR/admin.sock)")
	haDir := fs.String("haproxy-dir", "", "`DIR` of the rendered HAProxy files; enables pool sync and the SPOE agent on DIR/spoe.sock (default haproxy.dir)")
	haPID := fs.String("haproxy-pidfile", "", "HAProxy master pidfile `PATH`, for reloads (default DIR/haproxy.pid)")
	// nginx sync
	ngx := addNginxFlags(fs, "`DIR` of the rendered nginx files; enables nginx sync (re-render + reload)")
	// Kubernetes discovery
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for pools with discovery.kubernetes (default $KUBECONFIG, else in-cluster)")
	if err := cli.ParseFlags(fs, serveCmd, args); err != nil {
		return err
	}
	if *level != "" {
		if lvl, err := zerolog.ParseLevel(*level); err == nil {
			l := log.Level(lvl)
			log = &l
		}
	}
	cli.RouteKlog(log) // client-go's informers log through klog
	opts := control.Options{
		ConfigPath: *cfgPath, Listen: *listen, Watch: *watch, Kubeconfig: *kubeconfig, Version: version, Log: log,
		HAProxy: haproxy.SyncOptions{Socket: *haSocket, Dir: *haDir, PIDFile: *haPID},
		Check:   checkPolicies,
	}
	cfg, err := opts.Load(context.Background())
	if err != nil {
		return err
	}
	cli.LogWarnings(log, *cfgPath, cfg, nginxModeWarnings(cfg)...)
	srv, err := route.New(cfg, route.Options{Registry: policy.DefaultRegistry(), Log: log})
	if err != nil {
		return cli.WithFile(err, *cfgPath)
	}
	defer srv.Close() // stops KV-event subscriptions
	// turnout_build_info, go_*, process_*: gathered at scrape time only.
	if pm, err := procmetrics.New(version); err != nil {
		log.Warn().Err(err).Msg("process metrics unavailable")
	} else {
		srv.Extras().AddMetrics(pm.WriteMetrics)
	}
	ctx, stop := cli.StopContext()
	defer stop()
	if opts.Nginx, err = ngx.syncOptions(); err != nil {
		return err
	}
	loop, err := control.New(srv, opts)
	if err != nil {
		return err
	}
	return loop.Serve(ctx, cfg)
}
