//go:build !(linux && (amd64 || arm64))

package feedback

import (
	"context"
	"errors"
	"net"
)

// serveUDP reads one datagram per call until uc is closed (batch_linux.go
// reads them in batches).
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
	}
}
