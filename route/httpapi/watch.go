package httpapi

import (
	"errors"
	"net"
	"syscall"

	"github.com/valyala/fasthttp"
)

// connWatch tells flow control (route/flow) whether the proxy closed the
// call of a held request: nginx closes its upstream connection when the
// client goes away, and so does the HAProxy Lua action's httpclient.
// A request context viewed as a Watch: no allocation per request.
type connWatch fasthttp.RequestCtx

// Gone peeks at the socket without consuming: end of stream or an error
// means the caller left; data (a pipelined call) or nothing yet means it
// is still there.
func (w *connWatch) Gone() bool {
	c := (*fasthttp.RequestCtx)(w).Conn()
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	var b [1]byte
	// Control, not Read: Read would honour the connection's read deadline
	// (limits.read_timeout), long past for a request held that long.
	_ = rc.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil:
			gone = n == 0
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
		default:
			gone = true
		}
	})
	return gone
}
