// Package feeds says which producer feeds which policy: the producers the
// config turns on (fleet.Producer: engine scrapes, completion feedback,
// KV events, ...) matched against the signals each pool's policy declares
// it reads (fleet.Consumer). A consumed signal nothing feeds is a config
// warning at load (turnout check, serve, reload: route.CheckPolicies);
// /readyz?verbose lists every pool's feeds (WriteReadiness).
package feeds

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// configProducers is what cfg turns on for every pool; kv_events is per
// pool (poolProducers, staticKVEvents).
func configProducers(cfg *config.Config) fleet.Producers {
	on := fleet.Of(fleet.ProducerDecisions)
	if !cfg.Feedback.Disable {
		on |= fleet.Of(fleet.ProducerFeedback)
		if cfg.Proxy.FirstTokenTimed() {
			on |= fleet.Of(fleet.ProducerFirstToken)
		}
	}
	if !cfg.EngineMetrics.Disable {
		on |= fleet.Of(fleet.ProducerEngineMetrics)
	}
	if !cfg.Health.Disable {
		on |= fleet.Of(fleet.ProducerHealth)
	}
	if cfg.Cluster.Enabled() {
		on |= fleet.Of(fleet.ProducerCluster)
	}
	return on
}

// poolProducers is what feeds a live pool: the config's producers, and
// kv_events when one of its endpoints has a KV-event source.
func poolProducers(cfg *config.Config, p *fleet.Pool) fleet.Producers {
	on := configProducers(cfg)
	for _, e := range p.Endpoints {
		if _, ok := e.KVSource(); ok {
			return on | fleet.Of(fleet.ProducerKVEvents)
		}
	}
	return on
}

// staticKVEvents reports whether the config gives a pool's endpoints a
// KV-event source: an endpoint's kv_events, or a bind address (which
// also feeds the endpoints discovery adds).
func staticKVEvents(cfg *config.Config, dc *config.DeploymentConfig, pc *config.PoolConfig) bool {
	if cmp.Or(dc.KVEventsBind, cfg.KVEventsBind) != "" {
		return true
	}
	for k := range pc.Endpoints {
		if pc.Endpoints[k].KVEvents != "" {
			return true
		}
	}
	return false
}

// Warnings are the warnings for the signals pool j of deployment i reads
// through its policy pol and no producer of cfg feeds, at the policy's
// path.
func Warnings(cfg *config.Config, i, j int, pol fleet.Policy) []*config.FieldError {
	dc := &cfg.Deployments[i]
	pc := &dc.Pools[j]
	on := configProducers(cfg)
	if staticKVEvents(cfg, dc, pc) {
		on |= fleet.Of(fleet.ProducerKVEvents)
	}
	path := fmt.Sprintf("deployments[%d].policy", i)
	if pc.Policy != nil {
		path = fmt.Sprintf("deployments[%d].pools[%d].policy", i, j)
	}
	var out []*config.FieldError
	for _, s := range fleet.Unfed(fleet.SignalsOf(pol), on).List() {
		in := s.Info()
		var turnOn []string
		for _, p := range in.Needs.List() {
			turnOn = append(turnOn, p.Info().Config)
		}
		out = append(out, &config.FieldError{Path: path, Msg: fmt.Sprintf(
			"policy %s of pool %s reads the signal %s, which nothing configured feeds (needs %s): %s",
			dc.PoolPolicy(pc).Name, config.PoolName(dc.Name, pc.Role), in.Name, strings.Join(turnOn, ", or "), in.Without)})
	}
	return out
}

// WriteReadiness writes /readyz?verbose's line per pool: each signal its
// policy reads and the producers feeding it, "none" when nothing does.
func WriteReadiness(cfg *config.Config, pools []*fleet.Pool, b *strings.Builder) {
	for _, p := range pools {
		on := poolProducers(cfg, p)
		fmt.Fprintf(b, "signals pool %s (%s):", p.Name, p.PolicyName)
		for i, s := range fleet.SignalsOf(p.Policy).List() {
			if i > 0 {
				b.WriteByte(',')
			}
			by, fed := fleet.Feeds(s, on)
			src := by.String()
			if !fed {
				src = "none"
			}
			fmt.Fprintf(b, " %s<-%s", s, src)
		}
		b.WriteByte('\n')
	}
}
