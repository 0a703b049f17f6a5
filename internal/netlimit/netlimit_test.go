package netlimit

import (
	"io"
	"net"
	"testing"
	"time"
)

const reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

// serve accepts on a limited listener and hands every accepted connection
// to the test.
func serve(t *testing.T, max int) (addr string, accepted chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lln := Listener(ln, max, []byte(reply), nil)
	accepted = make(chan net.Conn, 16)
	go func() {
		for {
			c, err := lln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() { _ = lln.Close() })
	return ln.Addr().String(), accepted
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func take(t *testing.T, accepted chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-accepted:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted in 10s")
		return nil
	}
}

// refused reads what a connection over the cap gets: the reply, then EOF.
func refused(t *testing.T, c net.Conn) {
	t.Helper()
	b, err := io.ReadAll(c)
	if err != nil || string(b) != reply {
		t.Fatalf("over the cap: read %q (%v), want the reply then EOF", b, err)
	}
}

func TestListener(t *testing.T) {
	addr, accepted := serve(t, 2)
	dial(t, addr)
	take(t, accepted)
	dial(t, addr)
	b := take(t, accepted)

	// Third: refused with the reply, after sending a request as a proxy does.
	c := dial(t, addr)
	if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"); err != nil {
		t.Fatal(err)
	}
	refused(t, c)

	// A slot freed (twice: counted once) is usable again, and only one.
	_ = b.Close()
	_ = b.Close()
	dial(t, addr)
	take(t, accepted)
	refused(t, dial(t, addr))
	select {
	case x := <-accepted:
		t.Fatalf("accepted %v over the cap", x.RemoteAddr())
	default:
	}
}
