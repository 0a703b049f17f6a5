package nginx

import (
	"cmp"
	"slices"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/proxyconf"
)

// frontData is what nginx.tls and nginx.extra add to nginx.conf; zero when
// the config sets neither (the default render is unchanged).
type frontData struct {
	// ListenOpts follows the listen address: " ssl" or " ssl http2"
	// (nginx 1.22 spells HTTP/2 on the listen line; it then offers h2 and
	// http/1.1 by ALPN).
	ListenOpts  string
	Cert, Key   string
	Protocols   string // ssl_protocols
	ExtraHTTP   []string
	ExtraServer []string
}

func buildFront(cfg *config.Config, c *proxyconf.Checker) frontData {
	n := &cfg.Nginx
	f := frontData{ExtraHTTP: n.Extra.HTTP, ExtraServer: n.Extra.Server}
	if t := &n.TLS; t.Enabled() {
		f.ListenOpts = " ssl"
		if slices.Contains(t.ALPN, config.ALPNH2) {
			f.ListenOpts += " http2"
		}
		f.Cert = c.Path("nginx.tls.cert", t.Cert)
		f.Key = c.Path("nginx.tls.key", cmp.Or(t.Key, t.Cert))
		// Validation allows only these two; min 1.3 drops 1.2.
		f.Protocols = config.TLS12 + " " + config.TLS13
		if t.MinVersion == config.TLS13 {
			f.Protocols = config.TLS13
		}
	}
	return f
}

// CheckFiles checks what nginx.conf makes nginx read besides the rendered
// files: the nginx.tls certificate and key, on this host.
func CheckFiles(cfg *config.Config) error {
	return proxyconf.CheckTLSFiles(ErrRender, "nginx.tls", &cfg.Nginx.TLS, false)
}
