package control

import (
	"context"
	"fmt"
	"net"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/portholder"
	"github.com/turnout/turnout/route/epp"
)

// kindEPP is the Endpoint Picker's listener (epp.listen, with
// epp.health_listen and its TLS).
const kindEPP = "epp.listen"

// eppKey is the Endpoint Picker listener's settings, which a reload cannot
// change on the same address (keyDiff names the fields that differ).
func eppKey(cfg *config.Config) string {
	e := &cfg.EPP
	if !e.On() {
		return ""
	}
	return fmt.Sprintf("epp.listen=%s\nepp.health_listen=%s\nepp.tls.mode=%s\nepp.tls.cert_file=%s\nepp.tls.key_file=%s\nepp.server=%s\n",
		e.Listen, e.HealthListen, e.TLS.Mode, e.TLS.CertFile, e.TLS.KeyFile, e.Server)
}

// bindEPP opens the Endpoint Picker's sockets and readies its server.
func (l *listeners) bindEPP(nl *listener, cfg *config.Config) error {
	e := &cfg.EPP
	srv, err := epp.New(l.core.srv, epp.Options{Log: l.log, TLS: e.TLS, Server: e.Server})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", e.Listen)
	if err != nil {
		return portholder.Wrap(err, "tcp", e.Listen)
	}
	var hln net.Listener
	if e.HealthListen != "" {
		if hln, err = net.Listen("tcp", e.HealthListen); err != nil {
			_ = ln.Close()
			return fmt.Errorf("epp.health_listen: %w", portholder.Wrap(err, "tcp", e.HealthListen))
		}
	}
	var running *epp.Listener
	nl.serve = func() { running = srv.Serve(ln, hln) }
	nl.stop = func(ctx context.Context) {
		if running != nil {
			running.Shutdown(ctx)
		}
		_ = ln.Close() // never served: closed here
		if hln != nil {
			_ = hln.Close()
		}
	}
	return nil
}
