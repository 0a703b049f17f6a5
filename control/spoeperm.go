package control

import (
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
)

// shareSPOESocket hands a unix SPOE socket to the HAProxy workers'
// haproxy.user/group: they connect to it after dropping root, and a socket
// created under umask 022 only lets its owner (turnout) connect. Owner
// user/group, mode 0660. Without haproxy.user and haproxy.group nothing
// changes (the workers run as root). A failure (turnout not root, an unknown
// name) is logged: HAProxy then fails open, balancing without turnout.
func shareSPOESocket(addr string, cfg *config.Config, log *zerolog.Logger) {
	h := &cfg.HAProxy
	path, ok := strings.CutPrefix(addr, "unix@")
	if !ok && strings.HasPrefix(addr, "/") {
		path, ok = addr, true
	}
	if !ok || (h.User == "" && h.Group == "") {
		return
	}
	uid, gid := -1, -1
	var err error
	if h.User != "" {
		var u *user.User
		if u, err = user.Lookup(h.User); err == nil {
			uid, _ = strconv.Atoi(u.Uid)
			if h.Group == "" {
				gid, _ = strconv.Atoi(u.Gid)
			}
		}
	}
	if err == nil && h.Group != "" {
		var g *user.Group
		if g, err = user.LookupGroup(h.Group); err == nil {
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	if err == nil {
		err = os.Chown(path, uid, gid)
	}
	if err == nil {
		err = os.Chmod(path, 0o660)
	}
	if err != nil {
		log.Warn().Err(err).Str("socket", path).Str("haproxy_user", h.User).Str("haproxy_group", h.Group).
			Msg("cannot hand the SPOE socket to HAProxy's workers: they may not reach turnout and would balance without it (run turnout as root or as that group, or set haproxy.spoe to host:port)")
	}
}
