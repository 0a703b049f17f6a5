package proxyconf

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/turnout/turnout/internal/config"
)

// Tokens that may reach a proxy's file unquoted: names and header names are
// route's (route.NameRe, route.HeaderRe: one validator for config and
// renderers); addresses and paths must not carry spaces, quotes or comment
// characters.
var (
	hostRe = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252})$`)
	pathRe = regexp.MustCompile(`^/[A-Za-z0-9_./+@-]*$`)
)

// Checker checks the config values of one render and collects every
// problem, each wrapped with the renderer's error (haproxy.ErrRender,
// nginx.ErrRender), so one run reports them all.
type Checker struct {
	base  error
	proxy string // named in messages: "HAProxy", "nginx.conf"
	errs  []error
}

// NewChecker returns a Checker whose errors wrap base; proxy names the file
// or program in messages about characters it cannot take.
func NewChecker(base error, proxy string) *Checker { return &Checker{base: base, proxy: proxy} }

// Bad records a problem with field.
func (c *Checker) Bad(field, format string, a ...any) {
	c.errs = append(c.errs, fmt.Errorf("%w: %s: %s", c.base, field, fmt.Sprintf(format, a...)))
}

// Err returns every problem recorded, joined (nil when none).
func (c *Checker) Err() error { return errors.Join(c.errs...) }

// Path checks that p is an absolute path of plain characters.
func (c *Checker) Path(field, p string) string {
	if !filepath.IsAbs(p) || !pathRe.MatchString(p) {
		c.Bad(field, "%q must be an absolute path of [A-Za-z0-9_./+@-]", p)
	}
	return p
}

// Addr checks a host:port and returns it as the proxies write it (an IPv6
// host in brackets), the bare host and the port; zero values when bad.
func (c *Checker) Addr(field, a string) (hostPort, host string, port int) {
	h, ps, err := net.SplitHostPort(a)
	pn, perr := strconv.Atoi(ps)
	if err != nil || perr != nil || pn < 1 || pn > 65535 || h == "" {
		c.Bad(field, "%q must be host:port", a)
		return "", "", 0
	}
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if !hostRe.MatchString(h) {
		c.Bad(field, "host %q has characters %s cannot take", h, c.proxy)
		return "", "", 0
	}
	return h + ":" + strconv.Itoa(pn), strings.Trim(h, "[]"), pn
}

// Name checks a server, pool or deployment name.
func (c *Checker) Name(field, n string) string {
	if !config.NameRe.MatchString(n) {
		c.Bad(field, "%q must match %s", n, config.NameRe)
	}
	return n
}

// Header checks a header name and reports whether it is one.
func (c *Checker) Header(field, h string) bool {
	if !config.HeaderRe.MatchString(h) {
		c.Bad(field, "%q is not a header name", h)
		return false
	}
	return true
}
