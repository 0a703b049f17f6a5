package main

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/spoe"
)

// startSPOE serves HAProxy's SPOE connections (route/spoe) on addr until ctx
// ends. addr is host:port, or a unix socket as "unix@/path" or "/path" (the
// agent backend's server line then says unix@/path). serve.go calls it when
// haproxy.spoe is set; decisions share srv with the HTTP API, so config
// reloads apply to both.
func startSPOE(ctx context.Context, addr string, srv *route.Server, log *zerolog.Logger) error {
	ln, err := listenSPOE(addr)
	if err != nil {
		return fmt.Errorf("spoe listen %s: %w", addr, err)
	}
	agent := spoe.New(srv, spoe.Options{Log: log})
	go func() {
		if err := agent.Serve(ctx, ln); err != nil {
			log.Error().Err(err).Str("spoe_listen", addr).Msg("SPOE agent stopped")
		}
	}()
	log.Info().Str("spoe_listen", addr).Msg("SPOE agent listening")
	return nil
}

// spoeAddrFunc gives the SPOE agent's address for a config (listeners.spoeAddr):
// haproxy.spoe, else with haproxy.path spoe (the default) the socket next to
// the rendered HAProxy files, in haDir (--haproxy-dir) or haproxy.dir. ""
// means no agent.
func spoeAddrFunc(haDir string) func(*route.Config) string {
	return func(c *route.Config) string {
		dir := haDir
		if dir == "" {
			dir = c.HAProxy.Dir
		}
		return haproxy.SPOEAddr(c, dir)
	}
}
