package config

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"time"
)

// DefaultFeedbackAddr is where completion feedback goes unless the config
// says otherwise: without it decisions never complete, in-flight counts only
// grow until decision_ttl, and every load-aware policy drifts.
const DefaultFeedbackAddr = "127.0.0.1:9514"

// ParsePrefix reads an IP ("10.0.0.5") or a CIDR ("10.0.0.0/24").
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

var tokenRe = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)

func (c *Config) applyFeedbackDefaults() {
	f := &c.Feedback
	if len(f.Sources) == 0 {
		f.Sources = []string{"127.0.0.0/8", "::1"}
		// The proxies reach a specific feedback address from that address.
		if host, _, err := net.SplitHostPort(f.Syslog); err == nil {
			if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() && !a.IsLoopback() {
				f.Sources = append(f.Sources, a.Unmap().String())
			}
		}
	}
	orDefault(&f.StalledAfter, Duration(time.Minute))
	orDefault(&f.StalledMinDecisions, 20)
	st := &c.Health.Stall
	orDefault(&st.Budget, Duration(30*time.Second))
	orDefault(&st.ProbePath, "/v1/completions")
	orDefault(&st.Readmit, st.Budget)
	orDefault(&st.Scale, 3)
	orDefault(&st.Floor, Duration(time.Second))
}

func (c *Config) validateFeedback(bad func(field, format string, a ...any)) {
	f := &c.Feedback
	for i, src := range f.Sources {
		if _, err := ParsePrefix(src); err != nil {
			bad(fmt.Sprintf("feedback.sources[%d]", i), "%q is not an IP address or CIDR", src)
		}
	}
	if f.Token != "" && !tokenRe.MatchString(f.Token) {
		bad("feedback.token", "must be 16-128 characters of A-Z a-z 0-9 _ - (it is written into proxy log formats)")
	}
	if f.StalledAfter.D() < time.Second {
		bad("feedback.stalled_after", "%v is below 1s", f.StalledAfter.D())
	}
	if f.StalledMinDecisions < 1 {
		bad("feedback.stalled_min_decisions", "%d must be at least 1", f.StalledMinDecisions)
	}
	st := &c.Health.Stall
	if b := st.Budget.D(); b < 100*time.Millisecond {
		bad("health.stall.budget", "%v is below 100ms (use health.stall.disable to turn detection off)", b)
	}
	if st.Scale < 1 || st.Scale > 100 || math.IsNaN(st.Scale) {
		bad("health.stall.scale", "%v is out of range [1, 100] (the limit is scale x the replica's p99 first-token time)", st.Scale)
	}
	if st.Floor.D() < 100*time.Millisecond {
		bad("health.stall.floor", "%v is below 100ms", st.Floor.D())
	}
	if st.Readmit.D() < 100*time.Millisecond {
		bad("health.stall.readmit", "%v is below 100ms", st.Readmit.D())
	}
	if !strings.HasPrefix(st.ProbePath, "/") || strings.ContainsAny(st.ProbePath, " \t\r\n\"'") {
		bad("health.stall.probe_path", "%q is not an absolute path", st.ProbePath)
	}
	for i := range c.Deployments {
		for j, p := range c.Deployments[i].Pools {
			if p.StallBudget != nil && *p.StallBudget != 0 && p.StallBudget.D() < 100*time.Millisecond {
				bad(fmt.Sprintf("deployments[%d].pools[%d].stall_budget", i, j), "%v is below 100ms (0 turns detection off)", p.StallBudget.D())
			}
		}
	}
}

// StallBudget is the stall budget that applies to a pool (0 = off).
func (c *Config) StallBudget(p *PoolConfig) time.Duration {
	switch {
	case c.Health.Stall.Disable:
		return 0
	case p.StallBudget != nil:
		return p.StallBudget.D()
	case p.Role == RolePrefill:
		return 0
	}
	return c.Health.Stall.Budget.D()
}
