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
	"os"
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

// Holder describes the process holding port: "pid 1234 (turnout)", a
// client connection's "pid 1234 (curl)" when no listener has the port but
// an outgoing connection's local end does (the kernel picked it from its
// ephemeral range), or why it cannot be named.
func Holder(network string, port int) string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return "an unknown process (no /proc)"
	}
	inodes, clients := map[uint64]bool{}, map[uint64]bool{}
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
			switch {
			case l.LocalPort != uint64(port) || l.Inode == 0:
			case network == "udp" || l.St == tcpListen:
				inodes[l.Inode] = true
			default:
				clients[l.Inode] = true
			}
		}
	}
	if len(inodes) == 0 && len(clients) > 0 {
		return "a client connection of " + owner(fs, clients) + ": port " + strconv.Itoa(port) + ephemeral(port) +
			"; it is free again once that connection closes, or choose a port outside the range"
	}
	if len(inodes) == 0 {
		return "an unknown process (its socket is not in this network namespace's /proc/net)"
	}
	return owner(fs, inodes)
}

// ephemeral says whether port is in the range the kernel picks the local
// ports of outgoing connections from.
func ephemeral(port int) string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return " is a connection's local port"
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || port < lo || port > hi {
		return " is a connection's local port"
	}
	return fmt.Sprintf(" is in the kernel's ephemeral range %d-%d (net.ipv4.ip_local_port_range), where outgoing connections get their local ports", lo, hi)
}

// owner names the process with one of the sockets inodes.
func owner(fs procfs.FS, inodes map[uint64]bool) string {
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
