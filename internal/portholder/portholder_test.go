package portholder

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// Issue 28 item 9: a busy port's error names its holder (here, this test).
func TestBusyPortNamesHolder(t *testing.T) {
	for _, network := range []string{"udp", "tcp"} {
		var addr string
		var closeFn func() error
		if network == "udp" {
			pc, err := net.ListenPacket("udp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr, closeFn = pc.LocalAddr().String(), pc.Close
			_, err = net.ListenPacket("udp", addr)
			checkHeld(t, network, addr, err)
		} else {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr, closeFn = ln.Addr().String(), ln.Close
			_, err = net.Listen("tcp", addr)
			checkHeld(t, network, addr, err)
		}
		_ = closeFn()
	}
}

func checkHeld(t *testing.T, network, addr string, err error) {
	t.Helper()
	got := Wrap(err, network, addr)
	if !errors.Is(got, syscall.EADDRINUSE) {
		t.Fatalf("%s: %v: the cause is lost", network, got)
	}
	if want := fmt.Sprintf("pid %d (", os.Getpid()); !strings.Contains(got.Error(), want) {
		t.Fatalf("%s: %v: want the holder %q", network, got, want)
	}
}

func TestOtherErrorsUnchanged(t *testing.T) {
	e := errors.New("x")
	if Wrap(e, "udp", "127.0.0.1:1") != e || Wrap(nil, "udp", "127.0.0.1:1") != nil {
		t.Fatal("an error other than EADDRINUSE was changed")
	}
}

// A port held by a client connection (no listener: an outgoing
// connection's local end) is named as such, with the process, not as an
// unknown one; the bind's cause is kept.
func TestBusyPortClientSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addr := c.LocalAddr().String()
	_, err = net.Listen("tcp", addr)
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("listen on the client's local port %s: %v, want EADDRINUSE", addr, err)
	}
	got := Wrap(err, "tcp", addr).Error()
	for _, want := range []string{"a client connection of", fmt.Sprintf("pid %d (", os.Getpid())} {
		if !strings.Contains(got, want) {
			t.Errorf("%s: want %q", got, want)
		}
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		port := c.LocalAddr().(*net.TCPAddr).Port
		if _, err := fmt.Sscan(string(b), &lo, &hi); err == nil && port >= lo && port <= hi && !strings.Contains(got, "ephemeral range") {
			t.Errorf("%s: port %d is in %d-%d, want the ephemeral range named", got, port, lo, hi)
		}
	}
	if strings.Contains(got, "unknown process") {
		t.Errorf("%s: the holder is known", got)
	}
}
