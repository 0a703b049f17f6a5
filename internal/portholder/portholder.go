// Package portholder names the process holding a port a listener could not
// bind ("address already in use"), the way make run/demo do with ss
// (scripts/lib.sh), from /proc/net/{tcp,udp}[6] and /proc/*/fd. Linux only;
// elsewhere, or without permission to see the holder, it says less.
package portholder

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Explain returns " (held by NAME, pid N)" for a bind error that is
// EADDRINUSE on a TCP or UDP address, a vaguer note when the holder is not
// visible, and "" for any other error.
func Explain(err error) string {
	return explain("/proc", err)
}

func explain(proc string, err error) string {
	var op *net.OpError
	if !errors.Is(err, syscall.EADDRINUSE) || !errors.As(err, &op) || op.Addr == nil {
		return ""
	}
	_, ps, serr := net.SplitHostPort(op.Addr.String())
	port, perr := strconv.Atoi(ps)
	if serr != nil || perr != nil {
		return ""
	}
	proto := "tcp"
	if strings.HasPrefix(op.Net, "udp") {
		proto = "udp"
	}
	hs := holders(proc, proto, port)
	if len(hs) == 0 {
		return " (held by a process this user cannot see; ss -ltnup as root names it)"
	}
	return " (held by " + strings.Join(hs, "; ") + ")"
}

// holders lists "comm, pid N" for each process with a socket bound to port
// (listening, for TCP); nil when none is visible.
func holders(proc, proto string, port int) []string {
	inodes := map[string]bool{}
	for _, f := range []string{proto, proto + "6"} {
		socketInodes(filepath.Join(proc, "net", f), proto, port, inodes)
	}
	if len(inodes) == 0 {
		return nil
	}
	pids, _ := filepath.Glob(filepath.Join(proc, "[0-9]*"))
	var out []string
	for _, dir := range pids {
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			continue // another user's process
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			inode, ok := strings.CutPrefix(link, "socket:[")
			if err != nil || !ok || !inodes[strings.TrimSuffix(inode, "]")] {
				continue
			}
			comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
			out = append(out, fmt.Sprintf("%s, pid %s", cmpOr(strings.TrimSpace(string(comm)), "?"), filepath.Base(dir)))
			break
		}
	}
	return out
}

// socketInodes adds the inodes of sockets bound to port in a /proc/net table
// (TCP: in LISTEN state only).
func socketInodes(path, proto string, port int, into map[string]bool) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 {
			continue
		}
		_, hexPort, ok := strings.Cut(fs[1], ":")
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if !ok || err != nil || int(p) != port {
			continue
		}
		if proto == "tcp" && fs[3] != "0A" { // TCP_LISTEN
			continue
		}
		if fs[9] != "0" {
			into[fs[9]] = true
		}
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
