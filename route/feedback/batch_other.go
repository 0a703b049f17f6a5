//go:build !(linux && (amd64 || arm64))

package feedback

import (
	"context"
	"errors"
	"net"
	"time"
)

// serveUDP reads one datagram per call until uc is closed; after one that
// emptied the socket it waits feedback.batch_wait (as batch_linux.go does,
// without recvmmsg the wait only saves wake-ups).
func (l *Loop) serveUDP(ctx context.Context, uc *net.UDPConn) error {
	buf := make([]byte, 64<<10)
	for {
		// ReadFromUDPAddrPort: the source without an allocation per datagram.
		n, src, err := uc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			l.log.Warn().Err(err).Msg("feedback read")
			continue
		}
		l.Datagram(src.Addr(), buf[:n])
		if w := l.d.Snapshot().Config.Feedback.BatchWaitD(); w > 0 {
			time.Sleep(w)
		}
	}
}
