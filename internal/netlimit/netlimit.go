// Package netlimit caps the connections a listener keeps open at once. A
// connection over the cap is answered at once with the caller's fixed reply
// and closed, not left in the backlog, so the peer never waits for a
// connect timeout (golang.org/x/net/netutil.LimitListener blocks Accept
// instead). turnout's reply is route.OverloadedAnswer, a 503 the proxy glue
// understands.
package netlimit

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener returns ln with at most max connections open at once; a
// connection over it gets reply (raw bytes, e.g. a whole HTTP response) and
// is closed; onRefuse (if not nil) is told of each, so the refusal is
// counted with turnout's others.
func Listener(ln net.Listener, max int, reply []byte, onRefuse func()) net.Listener {
	return &limitListener{Listener: ln, max: int64(max), reply: reply, onRefuse: onRefuse}
}

type limitListener struct {
	net.Listener
	max   int64
	reply []byte
	open  atomic.Int64
	// onRefuse is told of each connection refused.
	onRefuse func()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			go refuse(c, l.reply)
			if l.onRefuse != nil {
				l.onRefuse()
			}
			continue
		}
		return &limitConn{Conn: c, l: l}, nil
	}
}

// refuse writes reply and closes. It reads what the peer already sent for
// a moment first: closing with unread data would reset the connection and
// could discard the reply before the peer reads it.
func refuse(c net.Conn, reply []byte) {
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	_, _ = c.Write(reply)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	_ = c.Close()
}

// limitConn frees its slot on the first Close.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

// NetConn is the connection underneath (flow control peeks at its socket
// to see whether a held request's caller left).
func (c *limitConn) NetConn() net.Conn { return c.Conn }

func (c *limitConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
