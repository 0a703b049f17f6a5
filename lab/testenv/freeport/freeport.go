// Package freeport hands tests a loopback port to start a server on. It is
// the one copy of the port picker the e2e harness, the nats-server and
// kube-apiserver test helpers and the live proxy tests share.
package freeport

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// Port returns a loopback port free for TCP and UDP a moment ago. It is
// drawn below Linux's ephemeral range (32768-60999): a port handed out by
// bind(":0") and closed again is soon handed to the next bind(":0") (the
// in-process mocks, HAProxy's own sockets), which then steals it from the
// process the test starts on it.
func Port(t testing.TB) int {
	t.Helper()
	for range 200 {
		p := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		// The UDP side too: some callers use it for syslog.
		if pc, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			pc.Close()
			l.Close()
			return p
		}
		l.Close()
	}
	t.Fatal("free port: none found in 20000-31999")
	return 0
}

// Addr is "127.0.0.1:PORT" for a Port.
func Addr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(Port(t))
}
