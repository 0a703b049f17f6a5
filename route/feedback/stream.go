package feedback

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// maxFrame bounds one syslog message on a stream; the reader's buffer
// holds one whole, so a message is handled in place (HAProxy's ring
// truncates its lines to maxlen, far below).
const maxFrame = 64 << 10

// errFrame is a stream that does not follow the framing.
var errFrame = errors.New("bad syslog framing")

// ServeStream reads proxy log lines from the TCP connections accepted on
// ln until ctx ends, then closes ln and the connections. A connection
// carries syslog messages framed as RFC 6587 says: octet-counted ("LEN
// SP MSG": HAProxy's ring with log-proto octet-count) or, for a message
// that does not start with a digit, ended by a newline (non-transparent
// framing). Each message is handled as a datagram is (Datagram): lines
// from contract.FeedbackTag on. A connection from a source outside
// feedback.sources is closed at once (counted, logged at most once a
// minute); broken framing ends the connection with a logged reason, and
// the proxy connects again with the framing afresh.
//
// No syslog library: the framing is a length prefix or a newline read
// from a bufio.Reader, handled in the reader's buffer without a copy; the
// Go syslog servers parse every message into a struct (an allocation per
// line) for fields this reader ignores.
func (l *Loop) ServeStream(ctx context.Context, ln net.Listener) error {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	stop := context.AfterFunc(ctx, func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors and the like: say so, and let it pass.
			l.log.Warn().Err(err).Msg("feedback accept")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			_ = c.Close()
			return nil
		}
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.readStream(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			_ = c.Close()
		}()
	}
}

// readStream handles one connection's messages until it ends.
func (l *Loop) readStream(c net.Conn) {
	var src netip.Addr
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		src = ta.AddrPort().Addr()
	}
	if !l.sourceAllowed(src, "feedback connection closed") {
		return
	}
	r := bufio.NewReaderSize(c, maxFrame)
	for {
		msg, n, err := nextFrame(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				l.bad.Add(1)
				l.log.Warn().Err(err).Str("source", src.String()).Msg("feedback connection closed")
			}
			return
		}
		l.eachLine(msg)
		_, _ = r.Discard(n) // after the lines: msg lives in r's buffer
	}
}

// nextFrame returns the next message in r's buffer and how many bytes to
// discard once it is handled (0 when already consumed).
func nextFrame(r *bufio.Reader) (msg []byte, n int, err error) {
	b, err := r.Peek(1)
	if err != nil {
		return nil, 0, err
	}
	if b[0] < '0' || b[0] > '9' {
		msg, err = r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, 0, fmt.Errorf("%w: a line over %d bytes", errFrame, maxFrame)
		}
		return msg, 0, err
	}
	for {
		c, err := r.ReadByte()
		if err != nil {
			return nil, 0, err
		}
		if c == ' ' {
			break
		}
		if c < '0' || c > '9' {
			return nil, 0, fmt.Errorf("%w: %q in a message length", errFrame, c)
		}
		if n = n*10 + int(c-'0'); n > maxFrame {
			return nil, 0, fmt.Errorf("%w: a message over %d bytes", errFrame, maxFrame)
		}
	}
	if msg, err = r.Peek(n); err != nil {
		return nil, 0, err
	}
	return msg, n, nil
}
