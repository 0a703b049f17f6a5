//go:build !(linux && (amd64 || arm64))

package feedback

import (
	"context"
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
			if l.readEnded(ctx, err) {
				return nil
			}
			continue
		}
		l.Datagram(src.Addr(), buf[:n])
	}
}
