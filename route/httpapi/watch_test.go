package httpapi

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
)

const flowYAML = `
limits: {read_timeout: 200ms, body_idle_timeout: 50ms}
deployments:
  - name: d
    models: [m]
    flow_control:
      saturation: {max_load: 1}
    pools:
      - endpoints:
          - {name: a, address: 127.0.0.1:1}
`

// A held call whose caller hangs up leaves flow control's queue, even
// after the connection's read deadline: the
// handler's watch sees the socket close (nginx closes its call to turnout
// when the client goes away).
func TestHeldCallerGone(t *testing.T) {
	s := mustServer(t, flowYAML)
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.NewHTTPServer()
	go func() { _ = srv.Serve(ln) }()
	defer srv.Shutdown()
	body := chatBody("m", "", "hi")
	call := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s", contract.PathRoute, len(body), body)
		return c
	}
	first := call() // admitted: the only replica is at max_load now
	defer first.Close()
	buf := make([]byte, 4096)
	_ = first.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := first.Read(buf); err != nil || !strings.Contains(string(buf[:n]), " 200 ") {
		t.Fatalf("first call: %q %v", buf[:n], err)
	}
	held := call()
	deadline := time.Now().Add(5 * time.Second)
	for flowSum(s, "turnout_flow_queued{", "") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("second call not held")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Held past limits.read_timeout: the connection's read deadline has
	// passed, and the watch must still see the close.
	time.Sleep(300 * time.Millisecond)
	held.Close()
	gone := func() int { return flowSum(s, "turnout_flow_requests_total{", `outcome="gone"`) }
	for gone() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the closed call was not dropped: gone=%d released=%d", gone(), flowSum(s, "turnout_flow_requests_total{", `outcome="released"`))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// flowSum sums the metric lines starting with prefix and containing sub.
func flowSum(s *testServer, prefix, sub string) int {
	var b strings.Builder
	s.WriteMetrics(&b)
	n := 0
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, sub) {
			v, _ := strconv.Atoi(l[strings.LastIndexByte(l, ' ')+1:])
			n += v
		}
	}
	return n
}
