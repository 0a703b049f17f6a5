package control

import (
	"context"
	"net"
	"strings"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/cluster"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/engineload"
	"github.com/turnout/turnout/route/feedback"
	"github.com/turnout/turnout/route/health"
	"github.com/turnout/turnout/route/hints"
	"github.com/turnout/turnout/route/httpapi"
	"github.com/turnout/turnout/route/reqlog"
	"github.com/turnout/turnout/route/spoe"
	"github.com/turnout/turnout/route/tracing"
)

// core is the decision core as the loop sees it: the Decider, its HTTP API
// and its completion-feedback loop (made once per Decider: feedback.New
// hooks its checks, metrics and readiness lines into it). Every call this
// package makes into route/ is in this file.
type core struct {
	srv *route.Decider
	api *httpapi.API
	fb  *feedback.Loop
}

func newCore(srv *route.Decider) core {
	return core{srv: srv, api: httpapi.New(srv), fb: feedback.New(srv)}
}

// apply swaps the routing snapshot to cfg (surviving endpoints keep their state).
func (c core) apply(cfg *config.Config) error { return c.srv.Apply(cfg) }

// rejected counts a config that was refused (turnout_config_reloads_total{result="failure"}).
func (c core) rejected() { c.srv.Rejected() }

// inflight is an endpoint's open decisions, which a discovered endpoint
// that disappeared drains before it is dropped.
func (c core) inflight(pool, name string) int64 {
	for _, p := range c.srv.Snapshot().Pools() {
		if p.Name == pool {
			for _, e := range p.Endpoints {
				if e.Name == name {
					return e.Inflight()
				}
			}
		}
	}
	return 0
}

// httpServer is the HTTP API (decisions, health, metrics) with cfg's
// connection settings.
func (c core) httpServer(cfg *config.Config) *fasthttp.Server { return c.api.NewHTTPServerFor(cfg) }

// addMetrics adds fn's lines to /metrics (the fleet's turnout_discovery_*).
func (c core) addMetrics(fn func(*strings.Builder)) { c.srv.Extras().AddMetrics(fn) }

// adminServer serves /healthz, /readyz and /metrics only (admin_listen).
func (c core) adminServer() *fasthttp.Server { return c.api.NewAdminHTTPServer() }

// serveFeedback reads completion lines from pc until ctx ends.
func (c core) serveFeedback(ctx context.Context, pc net.PacketConn) error {
	return c.fb.Serve(ctx, pc)
}

// serveFeedbackStream reads completion lines from the TCP connections
// accepted on ln (HAProxy's ring) until ctx ends.
func (c core) serveFeedbackStream(ctx context.Context, ln net.Listener) error {
	return c.fb.ServeStream(ctx, ln)
}

// serveSPOE runs the SPOE agent on ln until ctx ends.
func (c core) serveSPOE(ctx context.Context, ln net.Listener, log *zerolog.Logger) error {
	return spoe.New(c.srv, spoe.Options{Log: log}).Serve(ctx, ln)
}

// verifyServedModels refuses a model alias a replica would answer 404 for
// (route/health/modelcheck.go).
func verifyServedModels(ctx context.Context, cfg *config.Config) error {
	return health.VerifyServedModels(ctx, cfg, nil)
}

// httpServerKey is the HTTP listener's connection-level settings, which a
// reload cannot change on the same address.
func httpServerKey(cfg *config.Config) map[string]string { return httpapi.HTTPServerKey(cfg) }

// overloadedAnswer is what a connection over limits.max_conns is told.
func overloadedAnswer() []byte { return httpapi.OverloadedAnswer() }

// noteOverloaded counts a connection refused over limits.max_conns with
// turnout's other refusals.
func (c core) noteOverloaded() {
	c.srv.Refusals().NoteRefusal(503, contract.ReasonOverloaded, "too many connections to turnout (limits.max_conns)")
}

// onApply runs fn with each config the core accepts (and the current one).
func (c core) onApply(fn func(*config.Config)) {
	c.srv.OnApply(func(s *route.Snapshot) { fn(s.Config) })
}

// setRequestLog installs the request log at a sample rate (nil: off).
func (c core) setRequestLog(l *reqlog.Log, rate float64) {
	if l == nil {
		c.srv.Ledger().SetRequestSink(nil, 0)
		return
	}
	c.srv.Ledger().SetRequestSink(l, rate)
}

// newTracer builds the decision tracer of cfg (tracing on).
func (c core) newTracer(cfg *config.TracingConfig, log *zerolog.Logger) (*tracing.Tracer, error) {
	return tracing.New(cfg, log, tracing.Options{})
}

// setTracer installs the decision tracer (nil: off).
func (c core) setTracer(t *tracing.Tracer) {
	if t == nil {
		c.srv.Ledger().SetTracer(nil)
		return
	}
	c.srv.Ledger().SetTracer(t)
}

// addReadiness adds a writer of /readyz?verbose lines.
func (c core) addReadiness(fn func(*strings.Builder)) { c.srv.Extras().AddReadiness(fn) }

// The cluster splits the engine scrapes (engine_metrics.share).
var _ engineload.Share = (*cluster.Sync)(nil)

// config is the config the core runs.
func (c core) config() *config.Config { return c.srv.Snapshot().Config }

// startLoops starts the core's own loops until ctx ends: the decision-TTL
// and stall ticks, the health and served-model checks (a model goes only
// where it is served, and a missing alias is logged), the hints on
// settings the traffic shows do nothing (route/hints), the engine-load
// scrapes and, when cfg asks for it, the cluster's prefix sharing and its
// split of those scrapes (read at start only). wait returns once the cluster has flushed its last batch
// after ctx ended.
func (c core) startLoops(ctx context.Context, cfg *config.Config, log *zerolog.Logger) (wait func(), err error) {
	var cs *cluster.Sync
	if cfg.Cluster.Enabled() {
		if cs, err = cluster.New(c.srv, cfg.Cluster, log); err != nil {
			return nil, err
		}
	}
	go c.srv.Ticker().Run(ctx)
	hc := health.New(c.srv)
	go hc.Run(ctx)
	go hc.CheckServedModels(ctx, 0)
	hints.NewPrefix(log).Register(c.srv)
	scraper := engineload.New(c.srv, log)
	if cs != nil {
		scraper.SetShare(cs) // engine_metrics.share: one instance scrapes each replica
	}
	c.srv.Extras().AddMetrics(scraper.WriteMetrics)
	go scraper.Run(ctx)
	if cs == nil {
		c.srv.Extras().AddMetrics(cluster.WriteOffMetrics)
		return func() {}, nil
	}
	c.srv.Extras().AddMetrics(cs.WriteMetrics)
	go cs.Run(ctx)
	log.Info().Str("cluster", cfg.Cluster.String()).Msg("cluster prefix sharing on")
	return cs.Wait, nil
}
