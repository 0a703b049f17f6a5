// Package natstest runs Debian's nats-server (installed by .ci/run) on a
// loopback port for tests, the one place the unit tests of route/cluster and
// the end-to-end tests start it. A test skips, naming the package to
// install, when the binary is missing.
package natstest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/testenv/child"
	"github.com/turnout/turnout/lab/testenv/freeport"
)

// Server is a nats-server process on 127.0.0.1.
type Server struct {
	Port int
	URL  string
	Log  string // stdout and stderr, printed when the test fails
	p    *child.Process
}

// FreePort returns a free loopback port (freeport.Port).
func FreePort(t testing.TB) int { return freeport.Port(t) }

// Start runs nats-server on port (0: a free one) with extra arguments and
// waits until it accepts connections; t.Cleanup stops it.
func Start(t testing.TB, port int, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		// Debian installs it in /usr/sbin, often not in a user's PATH.
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr != nil {
			t.Skip("nats-server is not installed (apt-get install -y nats-server): skipping cluster test")
		}
		bin = "/usr/sbin/nats-server"
	}
	if port == 0 {
		port = FreePort(t)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := &Server{Port: port, URL: "nats://" + addr}
	s.Log = filepath.Join(t.TempDir(), "nats-server-"+strconv.Itoa(port)+".log")
	s.p, err = child.Start(exec.Command(bin, append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port)}, extra...)...), s.Log)
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(s.Log)
			if len(b) > 16<<10 {
				b = append([]byte("...\n"), b[len(b)-16<<10:]...)
			}
			t.Logf("---- nats-server log (%s) ----\n%s", s.Log, b)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return s
		}
		if s.Exited() || time.Now().After(deadline) {
			b, _ := os.ReadFile(s.Log)
			t.Fatalf("nats-server did not listen on %s: %s", addr, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends the server (SIGTERM, SIGKILL after 5 s) and waits for it;
// idempotent, so a test may stop it mid-run and cleanup stops nothing.
func (s *Server) Stop() { s.p.Stop(5 * time.Second) }

// Exited reports whether the process has ended.
func (s *Server) Exited() bool { return s.p.Exited() }
