package route

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/route/fleet"
)

// ListenFeedback reads proxy log lines over UDP syslog until ctx ends. Each
// datagram may hold lines (any syslog header); the part from FeedbackTag on
// is parsed as the line contract.go describes. Datagrams from a source not in
// feedback.sources are dropped (counted, logged at most once a minute).
func (s *Decider) ListenFeedback(ctx context.Context, addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("feedback listen %s: %w", addr, err)
	}
	return s.ServeFeedback(ctx, pc)
}

// ServeFeedback reads proxy log lines from pc until ctx ends, then closes
// it (cmd/turnout binds pc first, so a busy address rejects a reload).
func (s *Decider) ServeFeedback(ctx context.Context, pc net.PacketConn) error {
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		_ = pc.Close()
		return fmt.Errorf("feedback listen %s: not a UDP socket", pc.LocalAddr())
	}
	s.warnFeedbackExposure(uc)
	go func() {
		<-ctx.Done()
		_ = uc.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		// ReadFromUDPAddrPort: the source without an allocation per datagram.
		n, src, err := uc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Warn().Err(err).Msg("feedback read")
			continue
		}
		s.FeedbackDatagram(src.Addr(), buf[:n])
	}
}

// warnFeedbackExposure warns when the feedback socket is reachable from
// beyond this host: UDP sources are easy to spoof, the token is the real guard.
func (s *Decider) warnFeedbackExposure(uc *net.UDPConn) {
	la, _ := uc.LocalAddr().(*net.UDPAddr)
	if la == nil || la.IP.IsLoopback() {
		return
	}
	fc := s.snap.Load().Config.Feedback
	ev := s.log.Warn().Str("feedback", la.String()).Strs("sources", fc.Sources)
	if fc.Token == "" {
		ev.Msg("feedback listens beyond loopback without feedback.token: anyone able to spoof a listed source address can close decisions; set feedback.token or listen on 127.0.0.1")
		return
	}
	ev.Msg("feedback listens beyond loopback: lines are accepted only from feedback.sources and with feedback.token")
}

// FeedbackDatagram handles one datagram from src: every line in it.
func (s *Decider) FeedbackDatagram(src netip.Addr, b []byte) {
	snap := s.snap.Load()
	if !snap.fb.allowed(src) {
		s.m.feedbackRejected.Add(1)
		if s.fbRejectLog.allow(time.Now(), time.Minute) {
			s.log.Warn().Str("source", src.String()).Str(fleet.FieldReason, "source not in feedback.sources").Msg("feedback datagram dropped")
		}
		return
	}
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(bytes.TrimSpace(line)) > 0 {
			s.FeedbackLine(line)
		}
	}
}

// FeedbackLine handles one proxy log line; it reports whether a decision
// closed. The line's status, ms and ttfb feed the metrics and stall
// detection of the endpoint named by srv (else the decision's endpoint).
func (s *Decider) FeedbackLine(line []byte) bool {
	f, ok := parseFeedbackLine(line)
	if !ok {
		s.m.feedbackBad.Add(1)
		return false
	}
	snap := s.snap.Load()
	if tok := snap.fb.token; len(tok) > 0 && (!f.hasTok || subtle.ConstantTimeCompare(f.tok, tok) != 1) {
		s.m.feedbackRejected.Add(1)
		if s.fbRejectLog.allow(time.Now(), time.Minute) {
			s.log.Warn().Str(fleet.FieldReason, "missing or wrong feedback token").Msg("feedback line dropped")
		}
		return false
	}
	if !f.hasID {
		s.m.feedbackBad.Add(1)
		return false
	}
	s.m.feedback.Add(1)
	var st *fleet.State
	if len(f.id) > 0 && f.id[0] != '-' { // "-" or "": the proxy routed without turnout
		id, ok := ParseDecisionID(f.id)
		if !ok {
			s.m.feedbackBad.Add(1)
			return false
		}
		st = s.dec.closeState(id)
	}
	closed := st != nil
	switch {
	case f.hasSrv:
		st = nil
		if e := snap.byServer[string(f.srv)]; e != nil {
			st = e.State
		}
	case !closed:
		st = nil
	}
	if st != nil {
		st.Observe(f.status, f.ms, f.ttfb, time.Now().UnixNano())
	}
	return closed
}

// rateLog lets one message through per interval (lock-free).
type rateLog struct{ last atomic.Int64 }

func (r *rateLog) allow(now time.Time, every time.Duration) bool {
	last := r.last.Load()
	n := now.UnixNano()
	return n-last >= int64(every) && r.last.CompareAndSwap(last, n)
}
