package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/netlimit"
	"github.com/turnout/turnout/internal/portholder"
)

// listeners owns turnout's listeners: the HTTP API (listen), the admin
// endpoints (admin_listen), the SPOE agent (haproxy.spoe), the feedback
// socket (feedback.syslog) and the Endpoint Picker (epp.listen). A config
// change reopens the ones whose address changed, in an order that never
// leaves a proxy pointing at an address nobody serves:
//
//  1. prepare binds every new address; a bind that fails rejects the whole
//     config with the field named (the old snapshot and listeners stay);
//  2. the config is applied and the new listeners start serving, next to
//     the old ones;
//  3. the proxies are synced to the new addresses;
//  4. only then do the old listeners close, after a grace period that lets
//     in-flight decisions finish (feedback: the longest stream an old proxy
//     worker may still be finishing, so its completions still arrive).
//
// A listener whose address comes back while it is still draining is reused.
type listeners struct {
	log  *zerolog.Logger
	core core
	// haDir is --haproxy-dir: where the default path's SPOE socket lives
	// ("" = the config's haproxy.dir).
	haDir   string
	mu      sync.Mutex
	cur     map[string]*listener // kind -> serving listener
	retired []*listener          // closing after their grace
}

// Listener kinds, named by the config field that sets their address.
const (
	kindHTTP     = "listen"
	kindAdmin    = "admin_listen"
	kindSPOE     = "haproxy.spoe"
	kindFeedback = "feedback.syslog"
)

// listener is one open socket with the code serving it.
type listener struct {
	kind, addr string
	// key identifies the settings it was opened with (kindHTTP: the
	// connection-level limits too).
	key string
	// serve starts serving; stop ends it gracefully (waiting for in-flight
	// requests up to the context's deadline).
	serve func()
	stop  func(ctx context.Context)
	timer *time.Timer
}

func newListeners(c core, haDir string, log *zerolog.Logger) *listeners {
	return &listeners{log: log, core: c, haDir: haDir, cur: map[string]*listener{}}
}

// spoeAddr gives the SPOE agent's address for a config: haproxy.spoe, else
// with haproxy.path spoe (the default) the socket next to the rendered
// HAProxy files, in --haproxy-dir or haproxy.dir. "" means no agent.
func (l *listeners) spoeAddr(c *config.Config) string {
	return haproxy.SPOEAddr(c, l.spoeDir(c))
}

// spoeDir is the HAProxy directory the default SPOE socket goes in.
func (l *listeners) spoeDir(c *config.Config) string {
	if l.haDir != "" {
		return l.haDir
	}
	return c.HAProxy.Dir
}

// change is the outcome of prepare: listeners to start and the ones they replace.
type change struct {
	open    []*listener // newly bound (or revived from retired), not serving yet
	replace []*listener // serving now, to retire once the proxies follow
	fields  []string    // config fields whose listener changes
}

// prepare binds what cfg needs and has no listener yet. On error nothing
// changed.
func (l *listeners) prepare(cfg *config.Config) (*change, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := &change{}
	spoeAddr := l.spoeAddr(cfg)
	want := map[string]struct{ addr, key string }{
		kindHTTP:     {cfg.Listen, httpKey(cfg)},
		kindAdmin:    {cfg.AdminListen, cfg.AdminListen},
		kindSPOE:     {spoeAddr, spoeAddr},
		kindFeedback: {cfg.Feedback.Syslog, feedbackKey(cfg)},
		kindEPP:      {cfg.EPP.Listen, eppKey(cfg)},
	}
	var errs []error
	for _, kind := range []string{kindHTTP, kindAdmin, kindSPOE, kindFeedback, kindEPP} {
		w := want[kind]
		cur := l.cur[kind]
		if (cur != nil && cur.key == w.key) || (cur == nil && w.addr == "") {
			continue
		}
		if cur != nil && cur.addr == w.addr {
			// Same address, new settings (connection limits, TLS, the
			// feedback's TCP side): a second socket cannot bind it, so the
			// change needs a restart (or a new address). kind names the
			// address's field.
			errs = append(errs, fmt.Errorf("%w: %s: changed with %s unchanged; it applies on restart or with a new %s address",
				config.ErrConfig, keyDiff(cur.key, w.key), kind, kind))
			continue
		}
		if cur != nil {
			ch.replace = append(ch.replace, cur)
		}
		ch.fields = append(ch.fields, kind)
		if w.addr == "" {
			continue
		}
		if r := l.revive(kind, w.key); r != nil {
			ch.open = append(ch.open, r)
			continue
		}
		nl, err := l.bind(kind, w.addr, w.key, cfg)
		if err != nil {
			// A port in use names its holder (bind, internal/portholder).
			errs = append(errs, fmt.Errorf("%w: %s: %w", config.ErrConfig, kind, err))
			continue
		}
		ch.open = append(ch.open, nl)
	}
	if err := errors.Join(errs...); err != nil {
		for _, nl := range ch.open {
			if nl.timer == nil { // freshly bound; a revived one goes back to draining
				nl.stop(context.Background())
			} else {
				l.retired = append(l.retired, nl)
			}
		}
		return nil, err
	}
	return ch, nil
}

// revive takes a draining listener with the same settings back.
func (l *listeners) revive(kind, key string) *listener {
	for i, r := range l.retired {
		if r.kind == kind && r.key == key && r.timer.Stop() {
			l.retired = append(l.retired[:i], l.retired[i+1:]...)
			return r
		}
	}
	return nil
}

// start makes the prepared listeners serve. Call it once the config is applied.
func (l *listeners) start(ch *change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range ch.fields {
		delete(l.cur, f)
	}
	for _, nl := range ch.open {
		l.cur[nl.kind] = nl
		if nl.timer != nil {
			nl.timer = nil // revived: still serving
			l.log.Info().Str("field", nl.kind).Str("addr", nl.addr).Msg("listener kept: its address is back")
			continue
		}
		nl.serve()
		l.log.Info().Str("field", nl.kind).Str("addr", nl.addr).Msg("listening")
	}
}

// abort closes prepared listeners of a config that was not applied.
func (l *listeners) abort(ch *change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, nl := range ch.open {
		if nl.timer == nil {
			nl.stop(context.Background())
		} else {
			l.retired = append(l.retired, nl)
		}
	}
}

// retire closes the replaced listeners after grace (feedback: feedbackGrace).
func (l *listeners) retire(ch *change, grace, feedbackGrace time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, old := range ch.replace {
		g := grace
		if old.kind == kindFeedback {
			g = feedbackGrace
		}
		old := old
		l.log.Info().Str("field", old.kind).Str("addr", old.addr).Dur("grace", g).Msg("old listener closes after its grace period")
		old.timer = time.AfterFunc(g, func() {
			l.mu.Lock()
			for i, r := range l.retired {
				if r == old {
					l.retired = append(l.retired[:i], l.retired[i+1:]...)
					break
				}
			}
			l.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			old.stop(ctx)
			l.log.Info().Str("field", old.kind).Str("addr", old.addr).Msg("old listener closed")
		})
		l.retired = append(l.retired, old)
	}
}

// shutdown stops every listener, waiting for in-flight requests until ctx ends.
func (l *listeners) shutdown(ctx context.Context) {
	l.mu.Lock()
	all := append([]*listener(nil), l.retired...)
	for _, c := range l.cur {
		all = append(all, c)
	}
	l.cur, l.retired = map[string]*listener{}, nil
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, x := range all {
		if x.timer != nil {
			x.timer.Stop()
		}
		wg.Add(1)
		go func() { defer wg.Done(); x.stop(ctx) }()
	}
	wg.Wait()
}

// bind opens one listener.
func (l *listeners) bind(kind, addr, key string, cfg *config.Config) (*listener, error) {
	nl := &listener{kind: kind, addr: addr, key: key}
	switch kind {
	case kindHTTP:
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, portholder.Wrap(err, "tcp", addr)
		}
		ln = netlimit.Listener(ln, cfg.Limits.MaxConns, overloadedAnswer(), l.core.noteOverloaded)
		nl.serveHTTP(l.core.httpServer(cfg), ln, l.log, "listen", "HTTP listener stopped")
	case kindAdmin:
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, portholder.Wrap(err, "tcp", addr)
		}
		nl.serveHTTP(l.core.adminServer(), ln, l.log, "admin_listen", "admin listener stopped")
	case kindSPOE:
		if dir := l.spoeDir(cfg); dir != "" && cfg.HAProxy.SPOE == "" {
			// The default socket lives with the rendered HAProxy files;
			// turnout may start before anything wrote that directory.
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("haproxy dir: %w", err)
			}
		}
		ln, err := listenSPOE(addr)
		if err != nil {
			return nil, portholder.Wrap(err, "tcp", addr) // a unix@ path is returned as is
		}
		shareSPOESocket(addr, cfg, l.log)
		actx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		var served atomic.Bool // a listener aborted by prepare is never served
		nl.serve = func() {
			served.Store(true)
			go func() {
				defer close(done)
				if err := l.core.serveSPOE(actx, ln, l.log); err != nil {
					l.log.Error().Err(err).Str("spoe_listen", addr).Msg("SPOE agent stopped")
				}
			}()
		}
		nl.stop = func(ctx context.Context) {
			cancel()
			if served.Load() {
				select {
				case <-done:
				case <-ctx.Done():
				}
			}
			_ = ln.Close() // closed by the agent when served; never served: closed here
		}
	case kindEPP:
		if err := l.bindEPP(nl, cfg); err != nil {
			return nil, err
		}
	case kindFeedback:
		// UDP always (nginx, haproxy.feedback: udp); the same address on
		// TCP only for HAProxy's ring, so that a port free for UDP is all
		// the default needs.
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, portholder.Wrap(err, "udp", addr)
		}
		var ln net.Listener
		if feedbackTCP(cfg) {
			if ln, err = net.Listen("tcp", addr); err != nil {
				_ = pc.Close()
				return nil, portholder.Wrap(err, "tcp", addr)
			}
		}
		growReadBuffer(pc, feedbackReadBuffer, l.log)
		fctx, cancel := context.WithCancel(context.Background())
		nl.serve = func() {
			go func() {
				if err := l.core.serveFeedback(fctx, pc); err != nil {
					l.log.Error().Err(err).Str("feedback", addr).Msg("feedback listener stopped")
				}
			}()
			if ln != nil {
				go func() {
					if err := l.core.serveFeedbackStream(fctx, ln); err != nil {
						l.log.Error().Err(err).Str("feedback", addr).Msg("feedback TCP listener stopped")
					}
				}()
			}
		}
		nl.stop = func(context.Context) {
			cancel()
			_ = pc.Close()
			if ln != nil {
				_ = ln.Close()
			}
		}
	}
	return nl, nil
}

// feedbackTCP says whether the feedback address is also served on TCP:
// HAProxy's ring (haproxy.feedback: ring) forwards its lines over TCP.
func feedbackTCP(cfg *config.Config) bool {
	return cfg.HAProxy.Feedback == config.HAProxyFeedbackRing
}

// feedbackKey identifies the feedback listener's settings (keyDiff's
// form): its address and haproxy.feedback, which decides whether it takes TCP.
func feedbackKey(cfg *config.Config) string {
	return "feedback.syslog=" + cfg.Feedback.Syslog + "\nhaproxy.feedback=" + cfg.HAProxy.Feedback + "\n"
}

// feedbackReadBuffer is the receive buffer asked for the feedback socket. A
// lost datagram is a decision that stays open until decision_ttl; the
// kernel default (~208 KiB, a few hundred lines) overflows when turnout is
// descheduled for a second at a few hundred completions per second.
const feedbackReadBuffer = 8 << 20

// growReadBuffer raises a UDP socket's receive buffer: SO_RCVBUFFORCE when
// allowed (root, CAP_NET_ADMIN), else SO_RCVBUF (capped by net.core.rmem_max).
func growReadBuffer(pc net.PacketConn, n int, log *zerolog.Logger) {
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		return
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return
	}
	var got int
	_ = rc.Control(func(fd uintptr) {
		if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n) != nil {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n)
		}
		got, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
	})
	if got < n { // the kernel reports twice the usable size
		log.Warn().Int("bytes", got).Int("wanted", n).Msg("feedback socket receive buffer is small (raise net.core.rmem_max): bursts of completion lines may be dropped")
	}
}

// serveHTTP makes nl serve hs on ln once started, and stop it gracefully;
// a Serve that fails is logged as stopped, with the listener's config key
// (field) and address.
func (nl *listener) serveHTTP(hs *fasthttp.Server, ln net.Listener, log *zerolog.Logger, field, stopped string) {
	nl.serve = func() {
		go func() {
			if err := hs.Serve(ln); err != nil {
				log.Error().Err(err).Str(field, nl.addr).Msg(stopped)
			}
		}()
	}
	nl.stop = func(ctx context.Context) { stopHTTP(ctx, hs, ln) }
}

// stopHTTP closes the listener and waits for in-flight requests.
func stopHTTP(ctx context.Context, hs *fasthttp.Server, ln net.Listener) {
	if err := hs.ShutdownWithContext(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		_ = ln.Close()
	}
	_ = ln.Close() // in case Serve never ran
}

// httpKey encodes httpServerKey in a stable order.
func httpKey(cfg *config.Config) string {
	m := httpServerKey(cfg)
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		b.WriteString(k + "=" + m[k] + "\n")
	}
	return b.String()
}

// keyDiff names the fields that differ between two listener keys of
// "field=value" lines (httpKey, eppKey, feedbackKey).
func keyDiff(a, b string) string {
	am := map[string]string{}
	for _, line := range strings.Split(a, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			am[k] = v
		}
	}
	var diff []string
	for _, line := range strings.Split(b, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && am[k] != v {
			diff = append(diff, k)
		}
	}
	return strings.Join(diff, ", ")
}

// listenSPOE binds an SPOE address: host:port, or a unix socket as
// "unix@/path" or "/path".
func listenSPOE(addr string) (net.Listener, error) {
	network, address := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix@"); ok {
		network, address = "unix", p
	} else if strings.HasPrefix(addr, "/") {
		network = "unix"
	}
	if network == "unix" {
		// A socket left by a previous run blocks the bind; anything else at
		// that path is not ours to remove.
		if fi, err := os.Lstat(address); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(address)
		}
	}
	return net.Listen(network, address)
}
