package route

import (
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// LimitListener caps the connections open at once at limits.max_conns. A
// connection over the cap is answered at once with a 503 carrying
// X-Turnout-Reason: overloaded and closed, so the proxy glue applies its
// fail mode without counting a dead turnout (fasthttp's own Concurrency
// limit answers plain text without a reason). Accepting and refusing, not
// leaving the connection in the backlog, keeps the proxy from waiting for a
// connect timeout.
func LimitListener(ln net.Listener, max int) net.Listener {
	return &limitListener{Listener: ln, max: int64(max)}
}

type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
}

var overloadedAnswer = func() []byte {
	body := `{"error":{"message":"too many connections to turnout","type":"service_unavailable","code":"` + ReasonOverloaded + `"}}`
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n" + HdrReason + ": " + ReasonOverloaded +
		"\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			go refuse(c)
			continue
		}
		return &limitConn{Conn: c, l: l}, nil
	}
}

// refuse answers 503 overloaded and closes. It reads what the peer already
// sent for a moment first: closing with unread data would reset the
// connection and could discard the answer before the peer reads it.
func refuse(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	_, _ = c.Write(overloadedAnswer)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	_ = c.Close()
}

type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
