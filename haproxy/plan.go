package haproxy

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
)

// Server is one server line of a backend.
type Server struct {
	Name string
	Host string
	Port int
	// Maint is true when the live server is in maintenance (live state only).
	Maint bool
	// Drain: weight 0 for HAProxy's own balancing, kept for sessions in
	// progress (a terminating pod); desired and live.
	Drain bool
}

// Addr is host:port as HAProxy takes it.
func (s Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// State is a set of backends with their servers, desired (from a render) or
// live (read over the runtime socket).
type State struct {
	// Structure is the hash of everything but the server lines; a live
	// State takes it from the haproxy.cfg on disk ("" = unknown).
	Structure string
	// Backends maps backend name to its servers. A live State lists every
	// backend HAProxy runs, also empty ones.
	Backends map[string][]Server
	// Params are the keywords for servers added at run time (desired only).
	Params string
}

// CmdKind is the kind of a runtime change.
type CmdKind int

// Runtime changes, in the order Apply runs them: capacity first, removals last.
const (
	// CmdAdd: add server (starts in maint) + enable health + enable server.
	CmdAdd CmdKind = iota
	// CmdSetAddr: set server addr/port in place.
	CmdSetAddr
	// CmdEnable: a desired server found in maint (e.g. a half-done add) goes back to ready.
	CmdEnable
	// CmdDrain: set server state drain (Server.Drain) or back to ready.
	CmdDrain
	// CmdRemove: disable server, wait for its sessions to end (bounded), del server.
	CmdRemove
)

var cmdNames = [...]string{CmdAdd: "add", CmdSetAddr: "set-addr", CmdEnable: "enable", CmdDrain: "drain", CmdRemove: "remove"}

func (k CmdKind) String() string {
	if int(k) < len(cmdNames) {
		return cmdNames[k]
	}
	return "cmd(" + strconv.Itoa(int(k)) + ")"
}

// Cmd is one server change applied over the runtime API.
type Cmd struct {
	Kind    CmdKind
	Backend string
	Server  Server
	// Params are the server keywords for CmdAdd.
	Params string
}

// String renders the command for logs, in runtime API words.
func (c Cmd) String() string {
	id := c.Backend + "/" + c.Server.Name
	switch c.Kind {
	case CmdAdd:
		return "add server " + id + " " + c.Server.Addr() + " " + c.Params
	case CmdSetAddr:
		return "set server " + id + " addr " + c.Server.Host + " port " + strconv.Itoa(c.Server.Port)
	case CmdEnable:
		return "enable server " + id
	case CmdDrain:
		if c.Server.Drain {
			return "set server " + id + " state drain"
		}
		return "set server " + id + " state ready"
	case CmdRemove:
		return "drain and del server " + id
	}
	return c.Kind.String() + " " + id
}

// Plan is what a sync must do. When Reload is set the runtime commands are
// not needed: the rewritten file carries every server.
type Plan struct {
	Runtime []Cmd
	Reload  bool
	// Reasons explain the reload, one full sentence each.
	Reasons []string
}

// Empty reports whether nothing needs doing.
func (p Plan) Empty() bool { return len(p.Runtime) == 0 && !p.Reload }

// Diff compares the desired state with the live one. Membership changes in
// backends that exist on both sides become runtime commands; a backend that
// is new or gone, or any change outside server lines, needs a reload.
func Diff(desired, current State) Plan {
	var p Plan
	reload := func(format string, a ...any) {
		p.Reload = true
		p.Reasons = append(p.Reasons, fmt.Sprintf(format, a...))
	}
	switch {
	case current.Structure == "":
		reload("The configuration on disk was not rendered by turnout.")
	case current.Structure != desired.Structure:
		reload("Settings outside server lines changed (structure %s -> %s).", current.Structure, desired.Structure)
	}
	for _, b := range slices.Sorted(maps.Keys(desired.Backends)) {
		if _, ok := current.Backends[b]; !ok {
			reload("Backend %s is new.", b)
		}
	}
	for _, b := range slices.Sorted(maps.Keys(current.Backends)) {
		if _, ok := desired.Backends[b]; !ok {
			reload("Backend %s was removed.", b)
		}
	}

	for _, b := range slices.Sorted(maps.Keys(desired.Backends)) {
		live, ok := current.Backends[b]
		if !ok {
			continue
		}
		byName := make(map[string]Server, len(live))
		for _, s := range live {
			byName[s.Name] = s
		}
		want := make(map[string]bool, len(desired.Backends[b]))
		for _, s := range desired.Backends[b] {
			want[s.Name] = true
			cur, ok := byName[s.Name]
			switch {
			case !ok:
				p.Runtime = append(p.Runtime, Cmd{Kind: CmdAdd, Backend: b, Server: s, Params: desired.Params})
				continue
			case cur.Port != s.Port || (cur.Host != s.Host && net.ParseIP(s.Host) != nil):
				// Live addresses are resolved IPs: a hostname in the config
				// cannot be compared, and "set server addr" takes IPs only.
				p.Runtime = append(p.Runtime, Cmd{Kind: CmdSetAddr, Backend: b, Server: s})
			}
			if cur.Maint {
				p.Runtime = append(p.Runtime, Cmd{Kind: CmdEnable, Backend: b, Server: s})
			}
			if cur.Drain != s.Drain {
				p.Runtime = append(p.Runtime, Cmd{Kind: CmdDrain, Backend: b, Server: s})
			}
		}
		for _, s := range live {
			if !want[s.Name] {
				p.Runtime = append(p.Runtime, Cmd{Kind: CmdRemove, Backend: b, Server: s})
			}
		}
	}
	slices.SortStableFunc(p.Runtime, func(a, b Cmd) int { return cmp.Compare(a.Kind, b.Kind) })
	return p
}
