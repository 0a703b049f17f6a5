package cluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// natsServer is a nats-server process on a free loopback port.
type natsServer struct {
	port int
	cmd  *exec.Cmd
	URL  string
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startNATS runs Debian's nats-server (installed by .ci/run) on port (0: a
// free one); t.Cleanup stops it.
func startNATS(t testing.TB, port int) *natsServer {
	t.Helper()
	return startNATSArgs(t, port)
}

func startNATSArgs(t testing.TB, port int, extra ...string) *natsServer {
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
		port = freePort(t)
	}
	n := &natsServer{port: port, URL: "nats://127.0.0.1:" + strconv.Itoa(port)}
	n.cmd = exec.Command(bin, append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port)}, extra...)...)
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server did not listen on %d", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (idempotent).
func (n *natsServer) Stop() {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
		n.cmd = nil
	}
}
