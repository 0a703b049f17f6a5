package config

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// TLSConfig terminates TLS at the rendered proxy's frontend (haproxy.tls,
// nginx.tls). Off unless Cert is set. The files are read by the proxy, so
// they are checked (present, readable, a matching pair) when turnout renders
// or checks, on the proxy's host, not at config load.
type TLSConfig struct {
	// Cert is the PEM certificate (chain) file. HAProxy reads the key from
	// the same file or from Cert + ".key".
	Cert string `yaml:"cert"`
	// Key is the PEM private key file (nginx: required unless Cert holds
	// it; HAProxy: empty or Cert + ".key").
	Key string `yaml:"key"`
	// MinVersion is the oldest protocol accepted: TLSv1.2 (default) or TLSv1.3.
	MinVersion string `yaml:"min_version"`
	// ALPN is the protocols offered, in order: h2 and/or http/1.1
	// (default [h2, http/1.1]). nginx needs http/1.1 in it.
	ALPN []string `yaml:"alpn"`
}

// Enabled reports whether TLS is configured.
func (t *TLSConfig) Enabled() bool { return t.Cert != "" }

// TLS versions min_version takes.
const (
	TLS12 = "TLSv1.2"
	TLS13 = "TLSv1.3"
)

// ALPN protocol ids alpn takes.
const (
	ALPNH2     = "h2"
	ALPNHTTP11 = "http/1.1"
)

// HAProxyExtra is verbatim lines added at the end of each section of the
// rendered haproxy.cfg: the escape hatch for site-specific settings
// turnout does not model. They are part of the render, so sync keeps them
// and never sees them as drift.
type HAProxyExtra struct {
	Global   []string `yaml:"global"`
	Defaults []string `yaml:"defaults"`
	Frontend []string `yaml:"frontend"`
	// Backend lines go into every pool's backend.
	Backend []string `yaml:"backend"`
}

// NginxExtra is verbatim lines added to the rendered nginx.conf's http
// block and to its front server block.
type NginxExtra struct {
	HTTP   []string `yaml:"http"`
	Server []string `yaml:"server"`
}

// systemName is a user or group name (useradd's rules, loosely).
var systemName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}\$?$`)

func (t *TLSConfig) applyDefaults() {
	if !t.Enabled() {
		return
	}
	orDefault(&t.MinVersion, TLS12)
	if len(t.ALPN) == 0 {
		t.ALPN = []string{ALPNH2, ALPNHTTP11}
	}
}

func (t *TLSConfig) validate(field string, bad func(field, format string, a ...any)) {
	if !t.Enabled() {
		if t.Key != "" || t.MinVersion != "" || len(t.ALPN) > 0 {
			bad(field+".cert", "required when %s sets key, min_version or alpn", field)
		}
		return
	}
	plainPath(field+".cert", t.Cert, bad)
	if t.Key != "" {
		plainPath(field+".key", t.Key, bad)
	}
	if t.MinVersion != TLS12 && t.MinVersion != TLS13 {
		bad(field+".min_version", "%q must be %s or %s (older versions are broken)", t.MinVersion, TLS12, TLS13)
	}
	seen := map[string]bool{}
	for i, p := range t.ALPN {
		if p != ALPNH2 && p != ALPNHTTP11 {
			bad(fmt.Sprintf("%s.alpn[%d]", field, i), "%q must be %s or %s", p, ALPNH2, ALPNHTTP11)
		}
		if seen[p] {
			bad(fmt.Sprintf("%s.alpn[%d]", field, i), "%q listed twice", p)
		}
		seen[p] = true
	}
}

// plainPath: the proxies take these paths unquoted.
func plainPath(field, p string, bad func(field, format string, a ...any)) {
	if !filepath.IsAbs(p) || strings.ContainsAny(p, " \t\r\n\"'#;{}\\$") {
		bad(field, "%q must be an absolute path without spaces, quotes or ;#{}$\\", p)
	}
}

// validateExtra checks verbatim lines: one line each, no control characters
// (a line cannot smuggle a second one in), not empty.
func validateExtra(field string, lines []string, bad func(field, format string, a ...any)) {
	for i, l := range lines {
		if strings.TrimSpace(l) == "" || strings.ContainsFunc(l, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			bad(fmt.Sprintf("%s[%d]", field, i), "%q must be one non-empty line without control characters", l)
		}
	}
}

func (c *Config) validateFront(bad func(field, format string, a ...any)) {
	h := &c.HAProxy
	h.TLS.validate("haproxy.tls", bad)
	if h.TLS.Key != "" && h.TLS.Key != h.TLS.Cert+".key" {
		bad("haproxy.tls.key", "%q: HAProxy reads the key from the cert file or from %s.key; concatenate them (cat cert key > one.pem) or rename the key", h.TLS.Key, h.TLS.Cert)
	}
	for _, f := range []struct{ field, v string }{{"haproxy.user", h.User}, {"haproxy.group", h.Group}} {
		if f.v != "" && !systemName.MatchString(f.v) {
			bad(f.field, "%q is not a user or group name", f.v)
		}
	}
	if h.Chroot != "" {
		plainPath("haproxy.chroot", h.Chroot, bad)
		if h.Chroot == "/" {
			bad("haproxy.chroot", "\"/\" is no chroot; leave it empty")
		}
		if h.User == "" {
			bad("haproxy.chroot", "set haproxy.user too: a chroot does not confine a process that stays root")
		}
	}
	validateExtra("haproxy.extra.global", h.Extra.Global, bad)
	validateExtra("haproxy.extra.defaults", h.Extra.Defaults, bad)
	validateExtra("haproxy.extra.frontend", h.Extra.Frontend, bad)
	validateExtra("haproxy.extra.backend", h.Extra.Backend, bad)

	n := &c.Nginx
	n.TLS.validate("nginx.tls", bad)
	if n.TLS.Enabled() && !slices.Contains(n.TLS.ALPN, ALPNHTTP11) {
		bad("nginx.tls.alpn", "nginx always offers http/1.1: list it (h2 alone is not possible)")
	}
	for _, e := range []struct {
		field string
		lines []string
	}{{"nginx.extra.http", n.Extra.HTTP}, {"nginx.extra.server", n.Extra.Server}} {
		validateExtra(e.field, e.lines, bad)
		for i, l := range e.lines {
			// nginx reads on to the next ';': a missing one swallows the
			// rendered line after it.
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") && !strings.HasSuffix(l, ";") && !strings.HasSuffix(l, "{") && !strings.HasSuffix(l, "}") {
				bad(fmt.Sprintf("%s[%d]", e.field, i), "%q must end with ';' (or '{' / '}')", l)
			}
		}
	}
}
