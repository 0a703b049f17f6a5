package control

import (
	"strings"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/config"
)

// noAgentWhy says why an HAProxy rendered from cfg would find no SPOE agent
// ("" when it would find one, or when HAProxy does not route through one).
// The trap it names: `turnout render haproxy --out DIR` writes the agent
// address unix@DIR/turnout-spoe.sock, but serve without --haproxy-dir (and
// without haproxy.dir or haproxy.spoe in the config) cannot know DIR, binds
// no agent, and HAProxy fails open: sessions and prefix affinity stop
// without an error anywhere. Setting haproxy.spoe (or haproxy.dir) makes the
// config alone decide the address, for render and serve alike.
func (l *Loop) noAgentWhy(cfg *config.Config) string {
	if cfg.HAProxy.Path != config.HAProxyPathSPOE || l.lns.spoeAddr(cfg) != "" {
		return ""
	}
	if l.opts.Nginx != nil || (cfg.Nginx.Dir != "" && cfg.HAProxy.Dir == "") {
		return "" // an nginx setup: no HAProxy to find the agent
	}
	return "no SPOE agent listens (haproxy.path spoe without haproxy.spoe, haproxy.dir or --haproxy-dir): an HAProxy rendered with --out DIR expects unix@DIR/" +
		haproxy.SPOESocketName + " and fails open, balancing by itself (no sessions, no prefix affinity); set haproxy.spoe (or haproxy.dir) so render and serve agree"
}

// warnNoAgent logs the trap at warn level (at start and on a reload that
// brings it) and registers the /readyz?verbose line that states it while
// it lasts.
func (l *Loop) warnNoAgent(cfg *config.Config) {
	if why := l.noAgentWhy(cfg); why != "" {
		l.log.Warn().Str("field", "haproxy.spoe").Msg(why)
	}
}

// addNoAgentReadiness adds the verbose readiness line (it never changes
// readiness itself: an nginx-only setup is valid).
func (l *Loop) addNoAgentReadiness() {
	l.core.addReadiness(func(b *strings.Builder) {
		if why := l.noAgentWhy(l.core.config()); why != "" {
			b.WriteString("spoe: " + why + "\n")
		}
	})
}
