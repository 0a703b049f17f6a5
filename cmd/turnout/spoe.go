package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/spoe"
)

// startSPOE serves HAProxy's SPOE connections (route/spoe) on addr until ctx
// ends. addr is host:port, or a unix socket as "unix@/path" or "/path" (the
// agent backend's server line then says unix@/path). serve.go calls it when
// haproxy.spoe is set; decisions share srv with the HTTP API, so config
// reloads apply to both.
func startSPOE(ctx context.Context, addr string, srv *route.Server, log *zerolog.Logger) error {
	network, address := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix@"); ok {
		network, address = "unix", p
	} else if strings.HasPrefix(addr, "/") {
		network = "unix"
	}
	if network == "unix" {
		// A socket left by a previous run blocks the bind; anything else at
		// that path is not ours to remove.
		if fi, err := os.Lstat(address); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(address)
		}
	}
	ln, err := net.Listen(network, address)
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
