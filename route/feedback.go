package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
)

// ListenFeedback reads proxy log lines over UDP syslog until ctx ends. Each
// datagram may hold one line (any syslog header); the part from FeedbackTag
// on is parsed as "turnout-done id=<hex> srv=<name> status=<n> ms=<n>".
func (s *Server) ListenFeedback(ctx context.Context, addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("feedback listen %s: %w", addr, err)
	}
	return s.ServeFeedback(ctx, pc)
}

// ServeFeedback reads proxy log lines from pc until ctx ends, then closes
// it (cmd/turnout binds pc first, so a busy address rejects a reload).
func (s *Server) ServeFeedback(ctx context.Context, pc net.PacketConn) error {
	go func() {
		<-ctx.Done()
		_ = pc.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Warn().Err(err).Msg("feedback read")
			continue
		}
		for _, line := range bytes.Split(buf[:n], []byte{'\n'}) {
			if len(bytes.TrimSpace(line)) > 0 {
				s.FeedbackLine(line)
			}
		}
	}
}

var feedbackTagB = []byte(FeedbackTag + " ")

// FeedbackLine handles one proxy log line; it reports whether a decision closed.
func (s *Server) FeedbackLine(line []byte) bool {
	i := bytes.Index(line, feedbackTagB)
	if i < 0 {
		s.m.feedbackBad.Add(1)
		return false
	}
	s.m.feedback.Add(1)
	rest := line[i+len(feedbackTagB):]
	for len(rest) > 0 {
		var f []byte
		if j := bytes.IndexByte(rest, ' '); j >= 0 {
			f, rest = rest[:j], rest[j+1:]
		} else {
			f, rest = rest, nil
		}
		if v, ok := bytes.CutPrefix(f, []byte("id=")); ok {
			v = bytes.Trim(v, "\"")
			if len(v) == 0 || v[0] == '-' {
				return false // the proxy routed without turnout
			}
			id, ok := parseID(v)
			if !ok {
				s.m.feedbackBad.Add(1)
				return false
			}
			return s.Complete(id)
		}
	}
	s.m.feedbackBad.Add(1)
	return false
}
