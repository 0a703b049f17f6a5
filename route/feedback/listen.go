package feedback

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

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
)

// Listen reads proxy log lines over UDP syslog until ctx ends. Each
// datagram may hold lines (any syslog header); the part from contract.FeedbackTag on
// is parsed as the line route/contract/feedback.go describes. Datagrams from a source not in
// feedback.sources are dropped (counted, logged at most once a minute).
func (l *Loop) Listen(ctx context.Context, addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("feedback listen %s: %w", addr, err)
	}
	return l.Serve(ctx, pc)
}

// Serve reads proxy log lines from pc until ctx ends, then closes
// it (cmd/turnout binds pc first, so a busy address rejects a reload).
func (l *Loop) Serve(ctx context.Context, pc net.PacketConn) error {
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		_ = pc.Close()
		return fmt.Errorf("feedback listen %s: not a UDP socket", pc.LocalAddr())
	}
	l.warnFeedbackExposure(uc)
	go func() {
		<-ctx.Done()
		_ = uc.Close()
	}()
	return l.serveUDP(ctx, uc)
}

// readEnded tells a failed read of the feedback socket: true when it was
// closed (the listener stops), else the error is logged and reading goes on.
func (l *Loop) readEnded(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
		return true
	}
	l.log.Warn().Err(err).Msg("feedback read")
	return false
}

// warnFeedbackExposure warns when the feedback socket is reachable from
// beyond this host: UDP sources are easy to spoof, the token is the real guard.
func (l *Loop) warnFeedbackExposure(uc *net.UDPConn) {
	la, _ := uc.LocalAddr().(*net.UDPAddr)
	if la == nil || la.IP.IsLoopback() {
		return
	}
	fc := l.d.Snapshot().Config.Feedback
	ev := l.log.Warn().Str("feedback", la.String()).Strs("sources", fc.Sources)
	if fc.LineToken() == "" {
		ev.Msg("feedback listens beyond loopback without feedback.token: anyone able to spoof a listed source address can close decisions; set feedback.token or listen on 127.0.0.1")
		return
	}
	ev.Msg("feedback listens beyond loopback: lines are accepted only from feedback.sources and with feedback.token")
}

// Datagram handles one datagram from src: every line in it.
func (l *Loop) Datagram(src netip.Addr, b []byte) {
	if l.sourceAllowed(src, "feedback datagram dropped") {
		l.eachLine(b)
	}
}

// sourceAllowed says whether feedback from src is taken (feedback.sources);
// a refused source is counted and logged with msg at most once a minute.
func (l *Loop) sourceAllowed(src netip.Addr, msg string) bool {
	if l.d.Snapshot().FeedbackAllowed(src) {
		return true
	}
	l.rejected.Add(1)
	if l.fbRejectLog.allow(time.Now(), time.Minute) {
		l.log.Warn().Str("source", src.String()).Str(fleet.FieldReason, "source not in feedback.sources").Msg(msg)
	}
	return false
}

// eachLine handles every line in b (from an allowed source).
func (l *Loop) eachLine(b []byte) {
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) > 0 {
			l.Line(line)
		}
	}
}

// Line handles one proxy log line; it reports whether a decision
// closed. The line's status, ms, ttfb and tft feed the metrics, the first three stall
// detection of the endpoint named by srv (else the decision's endpoint);
// a line that closed no decision (id=-, unknown ids) may make an endpoint
// suspect but never clears it: forged lines cannot hide a stall.
func (l *Loop) Line(line []byte) bool {
	f, ok := parseFeedbackLine(line)
	if !ok {
		l.bad.Add(1)
		return false
	}
	snap := l.d.Snapshot()
	if tok := snap.FeedbackToken(); len(tok) > 0 && (!f.hasTok || subtle.ConstantTimeCompare(f.tok, tok) != 1) {
		l.rejected.Add(1)
		if l.fbRejectLog.allow(time.Now(), time.Minute) {
			l.log.Warn().Str(fleet.FieldReason, "missing or wrong feedback token").Msg("feedback line dropped")
		}
		return false
	}
	if !f.hasID {
		l.bad.Add(1)
		return false
	}
	l.lines.Add(1)
	var served *fleet.Endpoint
	if f.hasSrv {
		served = snap.EndpointByServer(f.srv)
	}
	// nginx names its choice in srv even after retrying elsewhere; the
	// address that answered says who served.
	if len(f.up) > 0 && (served == nil || string(served.AddrHdr) != string(f.up)) {
		if e := snap.EndpointByAddr(f.up); e != nil {
			served = e
		}
	}
	var st *fleet.State
	if len(f.id) > 0 && f.id[0] != '-' { // "-" or "": the proxy routed without turnout
		id, ok := contract.ParseDecisionID(f.id)
		if !ok {
			l.bad.Add(1)
			return false
		}
		st = l.d.Ledger().CloseDecisionWith(id, route.Completion{Status: f.status, Ms: f.ms, TTFB: f.ttfb, Retries: f.retries, Served: served,
			FirstTokenMs: f.tft, HasFirstToken: f.tft >= 0, Term: route.ParseTermState(f.term)})
	}
	closed := st != nil
	switch {
	case f.hasSrv:
		st = nil
		if served != nil {
			st = served.State
		}
	case !closed:
		st = nil
	}
	if st != nil {
		st.Observe(f.status, f.ms, f.ttfb, time.Now().UnixNano(), closed)
		st.ObserveFirstToken(f.tft)
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
