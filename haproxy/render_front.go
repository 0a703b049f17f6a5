package haproxy

import (
	"path/filepath"
	"strings"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/proxyconf"
)

// frontData is what haproxy.tls, user/group/chroot and extra add to
// haproxy.cfg; zero when the config sets none of them (the default render
// is unchanged).
type frontData struct {
	// BindTLS is appended to the frontend's bind line:
	// " ssl crt CERT alpn h2,http/1.1 ssl-min-ver TLSv1.2".
	BindTLS             string
	User, Group, Chroot string
	ExtraGlobal         []string
	ExtraDefaults       []string
	ExtraFrontend       []string
	ExtraBackend        []string
}

func buildFront(cfg *config.Config, c *proxyconf.Checker) frontData {
	h := &cfg.HAProxy
	f := frontData{
		User: h.User, Group: h.Group,
		ExtraGlobal: h.Extra.Global, ExtraDefaults: h.Extra.Defaults,
		ExtraFrontend: h.Extra.Frontend, ExtraBackend: h.Extra.Backend,
	}
	if h.Chroot != "" {
		f.Chroot = c.Path("haproxy.chroot", h.Chroot)
	}
	if t := &h.TLS; t.Enabled() {
		f.BindTLS = " ssl crt " + c.Path("haproxy.tls.cert", t.Cert) +
			" alpn " + strings.Join(t.ALPN, ",") + " ssl-min-ver " + t.MinVersion
	}
	return f
}

// inChroot is the path a worker sees for p (a unix socket it connects to
// after startup) once HAProxy chroots to root; ok is false when p is
// outside root, where a chrooted worker cannot reach it.
func inChroot(root, p string) (string, bool) {
	if root == "" {
		return p, true
	}
	rel, err := filepath.Rel(root, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return p, false
	}
	return "/" + rel, true
}

// CheckFiles checks what haproxy.cfg makes HAProxy read besides the
// rendered files: the haproxy.tls certificate and key, on this host.
func CheckFiles(cfg *config.Config) error {
	return proxyconf.CheckTLSFiles(ErrRender, "haproxy.tls", &cfg.HAProxy.TLS, true)
}
