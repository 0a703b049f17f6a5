// Package portholder names the process that holds a local port, for the
// error of a bind that failed with "address already in use": two turnout
// instances on one host collide on the default feedback port, and an
// operator should read who has it rather than hunt for it. It reads /proc
// (prometheus/procfs); elsewhere, or without the right to see the holder's
// file descriptors, the error says so and stays as it was.
package portholder

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"github.com/prometheus/procfs"
)

// Wrap returns err naming the holder of addr's port when err is a failed
// bind because the address is in use; any other err is returned as is.
// network is "udp" or "tcp".
func Wrap(err error, network, addr string) error {
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	_, ps, serr := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(ps)
	if serr != nil || perr != nil {
		return err
	}
	return fmt.Errorf("%w (port %d held by %s)", err, port, Holder(network, port))
}

// tcpListen is /proc/net/tcp's state of a listening socket.
const tcpListen = 10

// Holder describes the process holding port: "pid 1234 (turnout)", or why
// it cannot be named.
func Holder(network string, port int) string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return "an unknown process (no /proc)"
	}
	inodes := map[uint64]bool{}
	var tables []func() (procfs.NetUDP, error)
	if network == "udp" {
		tables = []func() (procfs.NetUDP, error){fs.NetUDP, fs.NetUDP6}
	} else {
		tables = []func() (procfs.NetUDP, error){
			func() (procfs.NetUDP, error) { t, err := fs.NetTCP(); return procfs.NetUDP(t), err },
			func() (procfs.NetUDP, error) { t, err := fs.NetTCP6(); return procfs.NetUDP(t), err },
		}
	}
	for _, read := range tables {
		lines, err := read()
		if err != nil {
			continue
		}
		for _, l := range lines {
			if l.LocalPort == uint64(port) && (network == "udp" || l.St == tcpListen) && l.Inode != 0 {
				inodes[l.Inode] = true
			}
		}
	}
	if len(inodes) == 0 {
		return "an unknown process (its socket is not in this network namespace's /proc/net)"
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return "an unknown process (/proc unreadable)"
	}
	for _, p := range procs {
		targets, err := p.FileDescriptorTargets()
		if err != nil {
			continue // another user's process: not ours to read
		}
		for _, t := range targets {
			var ino uint64
			if _, err := fmt.Sscanf(t, "socket:[%d]", &ino); err == nil && inodes[ino] {
				comm, _ := p.Comm()
				return fmt.Sprintf("pid %d (%s)", p.PID, comm)
			}
		}
	}
	return "a process this user cannot inspect (another user's; see ss -lpn as root)"
}
