package main

import (
	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/config"
)

// spoeAddrFunc gives the SPOE agent's address for a config (listeners.spoeAddr):
// haproxy.spoe, else with haproxy.path spoe (the default) the socket next to
// the rendered HAProxy files, in haDir (--haproxy-dir) or haproxy.dir. ""
// means no agent.
func spoeAddrFunc(haDir string) func(*config.Config) string {
	return func(c *config.Config) string {
		dir := haDir
		if dir == "" {
			dir = c.HAProxy.Dir
		}
		return haproxy.SPOEAddr(c, dir)
	}
}
