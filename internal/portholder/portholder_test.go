package portholder

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
)

// A second bind of a held port is explained with the holder: this test's
// own process, by pid and name.
func TestExplainNamesHolder(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = net.Listen("tcp", ln.Addr().String())
	if err == nil {
		t.Fatal("second bind succeeded")
	}
	got := Explain(err)
	if want := fmt.Sprintf("pid %d)", os.Getpid()); !strings.HasPrefix(got, " (held by ") || !strings.HasSuffix(got, want) {
		t.Errorf("Explain = %q, want the holder with %q", got, want)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	_, err = net.ListenPacket("udp", pc.LocalAddr().String())
	if got := Explain(err); !strings.Contains(got, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("udp: Explain = %q", got)
	}
	if got := Explain(errors.New("something else")); got != "" {
		t.Errorf("other error explained: %q", got)
	}
	// Without /proc (a container without it, another OS): a note, no failure.
	_, err = net.Listen("tcp", ln.Addr().String())
	if got := explain(t.TempDir(), err); !strings.Contains(got, "cannot see") {
		t.Errorf("no /proc: %q", got)
	}
}
