package bench

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/haproxy"
)

// proxyStack is one proxy setup of the cost run.
type proxyStack struct {
	group, name, dir string
	opts             StackOptions
	// bestOf: the plain proxy in one of its configurations; each round's
	// baseline is the best of them.
	bestOf bool
}

// proxyStacks lists the proxy setups to measure, in round order, and note
// rows for the ones that cannot run here. Within a group the plain proxy
// comes first: it is the baseline.
func proxyStacks(o CostOptions) (stacks []proxyStack, notes []CostRow, err error) {
	spec, err := ParsePolicySpec(o.ProxyPolicy)
	if err != nil {
		return nil, nil, err
	}
	if spec.IsProxyAlone() {
		return nil, nil, fmt.Errorf("cost: proxy policy %s is not a turnout policy", spec)
	}
	base := StackOptions{Model: "llama", ProxySetup: ProxySetup{HAProxy: o.HAProxy, Nginx: o.Nginx, NginxModule: o.NginxModule, Turnout: o.Turnout, Lab: o.Lab}, Log: o.Log}
	// bestOf: one of the plain rows each round's baseline is the best of.
	add := func(group, name, dir string, bestOf bool, spec PolicySpec, proxy string, edit func(*StackOptions)) {
		so := base
		so.Spec, so.Proxy = spec, proxy
		if edit != nil {
			edit(&so)
		}
		stacks = append(stacks, proxyStack{group: group, name: name, dir: dir, opts: so, bestOf: bestOf})
	}
	note := func(group, target, msg string) {
		o.Log.Warn().Str("group", group).Str("target", target).Msg("bench cost: " + msg)
		notes = append(notes, CostRow{Group: group, Target: target, Note: msg})
	}
	if o.HAProxy != "" {
		if _, lerr := exec.LookPath(o.HAProxy); lerr != nil {
			note("haproxy", "-", "skipped: haproxy not found")
		} else {
			// The baseline is HAProxy as an operator runs it without turnout:
			// default tune.bufsize, its own keep-alive defaults; also at another
			// nbthread and with another environment when asked, and each round
			// takes the best of these plain rows.
			add("haproxy", "haproxy roundrobin", "plain", true, PolicySpec{Policy: HAProxyRoundRobin}, ProxyHAProxy, nil)
			if n := o.HAProxyNbthread; n > 0 {
				add("haproxy", fmt.Sprintf("haproxy roundrobin, nbthread %d", n), "plain-nbt", true, PolicySpec{Policy: HAProxyRoundRobin}, ProxyHAProxy,
					func(so *StackOptions) { so.Nbthread = n })
			}
			env := strings.Join(o.HAProxyEnv, " ")
			if env != "" {
				add("haproxy", "haproxy roundrobin, "+env, "plain-env", true, PolicySpec{Policy: HAProxyRoundRobin}, ProxyHAProxy,
					func(so *StackOptions) { so.HAProxyEnv = o.HAProxyEnv })
			}
			whole := haproxy.WholeBodyBufSize(stackMaxBody)
			add("haproxy", fmt.Sprintf("haproxy roundrobin, tune.bufsize %d (whole-body buffers, as PD renders)", whole), "plain-wholebody",
				false, PolicySpec{Policy: HAProxyRoundRobin}, ProxyHAProxy, func(so *StackOptions) { so.PlainBufSize = whole })
			// With --route-body: plain HAProxy at the buffer size of the
			// default render and of each route_body row, which separates
			// what the buffer costs from what SPOE costs.
			for _, n := range routeBodyBufSizes(o.RouteBodies) {
				add("haproxy", fmt.Sprintf("haproxy roundrobin, tune.bufsize %d", n), fmt.Sprintf("plain-buf%d", n),
					false, PolicySpec{Policy: HAProxyRoundRobin}, ProxyHAProxy, func(so *StackOptions) { so.PlainBufSize = n })
			}
			add("haproxy", "haproxy+spoe+turnout "+spec.String()+" (default render)", "with-turnout-spoe", false, spec, ProxyHAProxy, nil)
			if n := o.HAProxyNbthread; n > 0 {
				add("haproxy", fmt.Sprintf("haproxy+spoe+turnout %s, nbthread %d", spec, n), "with-turnout-spoe-nbt", false, spec, ProxyHAProxy,
					func(so *StackOptions) { so.Nbthread = n })
			}
			if env != "" {
				add("haproxy", fmt.Sprintf("haproxy+spoe+turnout %s, %s", spec, env), "with-turnout-spoe-env", false, spec, ProxyHAProxy,
					func(so *StackOptions) { so.HAProxyEnv = o.HAProxyEnv })
			}
			for _, n := range o.RouteBodies {
				add("haproxy", fmt.Sprintf("haproxy+spoe+turnout %s, route_body %d (tune.bufsize %d)", spec, n, haproxy.RouteBodyBufSize(n)),
					fmt.Sprintf("with-turnout-spoe-rb%d", n), false, spec, ProxyHAProxy, func(so *StackOptions) { so.RouteBody = n })
			}
			// What retry before bytes (haproxy.l7_retries: true, a copy of
			// each request) costs: the same with it.
			add("haproxy", "haproxy+spoe+turnout "+spec.String()+", l7_retries: true", "with-turnout-spoe-l7retry", false, spec, ProxyHAProxy,
				func(so *StackOptions) { so.L7Retries = true })
			// What batching the feedback lines through HAProxy's ring
			// changes against a UDP datagram per line.
			add("haproxy", "haproxy+spoe+turnout "+spec.String()+", feedback: ring", "with-turnout-spoe-ringfb", false, spec, ProxyHAProxy,
				func(so *StackOptions) { so.HAProxyFeedback = config.HAProxyFeedbackRing })
			// What the first-token timer (response headers held for the
			// first body bytes) costs: the same without it.
			add("haproxy", "haproxy+spoe+turnout "+spec.String()+", first_token_timing: false", "with-turnout-spoe-notft", false, spec, ProxyHAProxy,
				func(so *StackOptions) { so.NoFirstTokenTiming = true })
			add("haproxy", "haproxy+lua+turnout "+spec.String(), "with-turnout-lua", false, spec, ProxyHAProxy,
				func(so *StackOptions) { so.HAProxyPath = config.HAProxyPathLua })
		}
	}
	if o.Nginx == "" {
		return stacks, notes, nil
	}
	if msg := NginxMissing(o.Nginx, o.NginxModule, false); msg != "" {
		note("nginx", "-", "skipped: "+msg)
		return stacks, notes, nil
	}
	hspec, err := ParsePolicySpec(o.NginxHeaderPolicy)
	if err != nil {
		return nil, nil, err
	}
	if hspec.IsProxyAlone() {
		return nil, nil, fmt.Errorf("cost: nginx header policy %s is not a turnout policy", hspec)
	}
	// nginx's defaults plus streaming settings; then the same with
	// turnout's in-memory body buffer.
	add("nginx", "nginx roundrobin", "nginx-plain", false, PolicySpec{Policy: NginxRoundRobin}, ProxyNginx, nil)
	add("nginx", fmt.Sprintf("nginx roundrobin, client_body_buffer_size %d (as body mode renders)", stackMaxBody), "nginx-plain-bodybuf",
		false, PolicySpec{Policy: NginxRoundRobin}, ProxyNginx, func(so *StackOptions) { so.PlainNginxBodyBuffer = true })
	// The first-token timer (an njs body filter, and njs itself in header
	// mode) costs the difference to the first_token_timing: false rows.
	njsMissing := NginxMissing(o.Nginx, o.NginxModule, true)
	headerName := "nginx+auth_request+turnout " + hspec.String()
	if njsMissing != "" {
		note("nginx", headerName, "skipped: "+njsMissing+" (the first-token timer)")
	} else {
		add("nginx", headerName, "nginx-header", false, hspec, ProxyNginx, func(so *StackOptions) { so.NginxMode = config.NginxModeHeader })
	}
	add("nginx", headerName+", first_token_timing: false", "nginx-header-notft", false, hspec, ProxyNginx,
		func(so *StackOptions) { so.NginxMode, so.NoFirstTokenTiming = config.NginxModeHeader, true })
	bodyName := "nginx+njs+turnout " + spec.String()
	if njsMissing != "" {
		note("nginx", bodyName, "skipped: "+njsMissing)
	} else {
		add("nginx", bodyName, "nginx-body", false, spec, ProxyNginx, func(so *StackOptions) { so.NginxMode = config.NginxModeBody })
		add("nginx", bodyName+", first_token_timing: false", "nginx-body-notft", false, spec, ProxyNginx,
			func(so *StackOptions) { so.NginxMode, so.NoFirstTokenTiming = config.NginxModeBody, true })
	}
	return stacks, notes, nil
}

// routeBodyBufSizes are the tune.bufsize values of the default render and
// of the route_body rows, once each (none without route_body rows).
func routeBodyBufSizes(routeBodies []int) []int {
	if len(routeBodies) == 0 {
		return nil
	}
	sizes := []int{haproxy.RouteBodyBufSize(config.DefaultRouteBody)}
	for _, rb := range routeBodies {
		if n := haproxy.RouteBodyBufSize(rb); !slices.Contains(sizes, n) {
			sizes = append(sizes, n)
		}
	}
	return sizes
}
