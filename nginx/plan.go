package nginx

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The sync plan: what a new render needs from the running nginx. nginx.conf
// on disk is what nginx runs (a sync writes the file only when it reloads,
// or when nginx is down, for its start), so the plan compares the new
// render with that file.
//
// Requests turnout routes go to the address it answered (the maps of
// nginx.conf.tmpl), so replicas coming and going need no reload: a reload
// closes idle keep-alive connections, and a request a client writes into
// one at that moment fails. A reload is planned only for the structure (the
// render without its replicas) or when what nginx balances by itself (a
// pool: fail-open, requests turnout is not asked about, the retry of a
// verdict without fallback) would no longer work as loaded.

// Running is the part of the nginx.conf on disk the plan looks at.
type Running struct {
	// Structure is the file's turnout-structure line ("" without one).
	Structure string
	// Pools maps a pool upstream to its server addresses.
	Pools map[string][]string
	// Known are the addresses with a per-replica keepalive upstream.
	Known map[string]bool
}

// structureLine starts the comment line that carries Summary.Structure.
const structureLine = "# turnout-structure: "

// ParseRunning reads a nginx.conf this package rendered.
func ParseRunning(conf []byte) Running {
	r := Running{Pools: map[string][]string{}, Known: map[string]bool{}}
	sc := bufio.NewScanner(bytes.NewReader(conf))
	sc.Buffer(nil, 1<<20)
	up := "" // the upstream block being read
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch f := strings.Fields(line); {
		case strings.HasPrefix(line, structureLine):
			r.Structure = strings.TrimPrefix(line, structureLine)
		case len(f) == 3 && f[0] == "upstream" && f[2] == "{":
			up = f[1]
			if up != "turnout_route" && !strings.HasPrefix(up, endpointPrefix) {
				r.Pools[up] = []string{}
			}
		case up != "" && line == "}":
			up = ""
		case up != "" && len(f) >= 2 && f[0] == "server":
			addr := strings.TrimSuffix(f[1], ";")
			switch {
			case up == "turnout_route":
			case strings.HasPrefix(up, endpointPrefix):
				r.Known[addr] = true
			case !slices.Contains(f, "down;"): // the placeholder of an empty pool
				r.Pools[up] = append(r.Pools[up], addr)
			}
		}
	}
	return r
}

// Plan is what a sync does with a render that differs from the file.
type Plan struct {
	// Reload: check, write and reload. Otherwise the file and nginx stay
	// as they are (the change needs neither).
	Reload bool
	// Reason says why, or what changed without a reload.
	Reason string
}

// planOnDisk compares a render with the files in dir: same when every file
// has exactly this content, else the plan.
func planOnDisk(dir string, out *Rendered) (Plan, bool, error) {
	var conf []byte
	for _, f := range out.Files() {
		b, err := os.ReadFile(filepath.Join(dir, f.Name))
		if errors.Is(err, fs.ErrNotExist) {
			return Plan{Reload: true, Reason: f.Name + " is not on disk yet"}, false, nil
		}
		if err != nil {
			return Plan{}, false, fmt.Errorf("read %s: %w", f.Name, err)
		}
		if bytes.Equal(b, f.Data) {
			continue
		}
		if f.Name != ConfigFile {
			return Plan{Reload: true, Reason: f.Name + " changed"}, false, nil
		}
		conf = b
	}
	if conf == nil {
		return Plan{}, true, nil
	}
	return PlanSync(ParseRunning(conf), &out.Summary), false, nil
}

// PlanSync decides for a render summarized by next against the running
// file run.
func PlanSync(run Running, next *Summary) Plan {
	if run.Structure != next.Structure {
		return Plan{Reload: true, Reason: structureReason(run, next)}
	}
	var changes, reload []string
	for _, pool := range slices.Sorted(maps.Keys(next.Pools)) {
		have := run.Pools[pool]
		want := addrs(next.Pools[pool])
		for _, a := range want {
			if !slices.Contains(have, a) {
				changes = append(changes, fmt.Sprintf("server %s added to pool %s", a, pool))
				if !ipLiteral(a) && !run.Known[a] {
					reload = append(reload, fmt.Sprintf("server %s in pool %s is a host name, which nginx resolves only when it loads its config", a, pool))
				}
			}
		}
		for _, a := range have {
			if !slices.Contains(want, a) {
				changes = append(changes, fmt.Sprintf("server %s removed from pool %s", a, pool))
			}
		}
		if len(want) > 0 && !slices.ContainsFunc(have, func(a string) bool { return slices.Contains(want, a) }) {
			reload = append(reload, fmt.Sprintf("none of the servers nginx balances pool %s over (fail-open, requests turnout is not asked about) is left", pool))
		}
	}
	if len(reload) > 0 {
		return Plan{Reload: true, Reason: strings.Join(reload, "; ")}
	}
	if len(changes) == 0 {
		// Same structure and addresses, different text: the replicas'
		// order (discovery may list them in another) or names. The maps
		// are keyed by address, so nginx routes the same either way.
		return Plan{Reason: "the order or the names of the replicas changed"}
	}
	return Plan{Reason: strings.Join(changes, "; ")}
}

// structureReason names what changed in the structure, as far as pools go.
func structureReason(run Running, next *Summary) string {
	if run.Structure == "" {
		return "the nginx.conf on disk has no turnout-structure line (not rendered by this version)"
	}
	var parts []string
	for _, pool := range slices.Sorted(maps.Keys(next.Pools)) {
		if _, ok := run.Pools[pool]; !ok {
			parts = append(parts, fmt.Sprintf("pool %s added with %d servers", pool, len(next.Pools[pool])))
		}
	}
	for _, pool := range slices.Sorted(maps.Keys(run.Pools)) {
		if _, ok := next.Pools[pool]; !ok {
			parts = append(parts, fmt.Sprintf("pool %s removed", pool))
		}
	}
	if len(parts) == 0 {
		return "settings other than the replicas changed"
	}
	return strings.Join(parts, "; ")
}

// addrs turns Summary "name=addr" entries into addresses.
func addrs(entries []string) []string {
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		_, a, _ := strings.Cut(e, "=")
		out = append(out, a)
	}
	return out
}

// ipLiteral reports whether addr is ip:port: nginx reaches it from a
// variable without a resolver.
func ipLiteral(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	_, err = netip.ParseAddr(h)
	return err == nil
}
