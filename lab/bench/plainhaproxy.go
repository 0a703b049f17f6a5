package bench

import (
	"fmt"
	"strings"
)

// PlainHAProxyOptions describe an HAProxy that balances on its own.
type PlainHAProxyOptions struct {
	Dir     string
	Listen  string
	Balance string // roundrobin or leastconn
	Servers []Endpoint
	// BufSize sets tune.bufsize (0: HAProxy's default, the honest baseline;
	// >0: the equal-buffer row).
	BufSize int
	// Nbthread sets nbthread (0: HAProxy's default, one thread per CPU).
	Nbthread int
}

// PlainHAProxyConfig renders the "HAProxy alone" baseline as an operator
// runs it without turnout: HAProxy's default buffers and keep-alive, the
// streaming setting SSE needs (http-no-delay) and the rendered timeouts, no
// body buffering, HAProxy's own balance algorithm.
func PlainHAProxyConfig(o PlainHAProxyOptions) []byte {
	var b strings.Builder
	b.WriteString("# HAProxy alone (turnout-lab bench baseline).\nglobal\n")
	fmt.Fprintf(&b, "    pidfile %s/haproxy.pid\n    maxconn 4096\n", o.Dir)
	if o.BufSize > 0 {
		fmt.Fprintf(&b, "    tune.bufsize %d\n", o.BufSize)
	}
	if o.Nbthread > 0 {
		fmt.Fprintf(&b, "    nbthread %d\n", o.Nbthread)
	}
	b.WriteString(`
defaults
    mode http
    option http-no-delay
    timeout connect 2000ms
    timeout client 600000ms
    timeout server 600000ms
    timeout http-request 30s
    timeout http-keep-alive 60s
    timeout queue 2000ms
    timeout check 1000ms

frontend bench
`)
	fmt.Fprintf(&b, "    bind %s\n    default_backend replicas\n\nbackend replicas\n    balance %s\n", o.Listen, o.Balance)
	b.WriteString("    option httpchk GET /health\n    http-check expect status 200\n")
	for _, s := range o.Servers {
		fmt.Fprintf(&b, "    server %s %s check inter 5000ms fall 2 rise 1\n", s.Name, s.Address)
	}
	return []byte(b.String())
}
