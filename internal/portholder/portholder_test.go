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
