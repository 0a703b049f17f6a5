// Package spoe is turnout's SPOE agent: HAProxy's Stream Processing Offload
// Engine sends each request's routing inputs (method, path, headers, body)
// as a NOTIFY frame over a few persistent, pipelined connections, and the
// agent answers with an ACK that sets txn variables (server, pool,
// fallbacks, decision, or a refusal to relay). It replaces the Lua action's
// per-request HTTP call to /internal/route.
//
// Every decision goes through route.Decider.Decide, the entry point the HTTP
// handler uses too, so the two paths cannot drift apart: the agent reads the
// message into a contract.Input and writes the contract.Verdict as variables
// (route/contract/glue.go names them), with no HTTP round trip.
//
// Concurrency: a connection's frames are decided inline by its reader
// goroutine, and the ACKs of a burst are flushed together, which is the
// cheapest way to serve microsecond decisions. When the config has a
// prefill/decode deployment a decision can wait on a prefill replica, so the
// frames go to worker goroutines instead and one slow prefill cannot hold up
// the other requests multiplexed on the same connection.
//
// The SPOP framing is written here rather than taken from a library: the
// candidates either read frames with a single Read (a short read on a large
// body kills the connection), wrote ACKs from several goroutines without a
// lock, capped frames at 64 KiB, or allocated several objects per frame.
package spoe

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
)

// Log field names.
const (
	fieldRemote = "remote"
	fieldStatus = "status"
)

// Defaults.
const (
	// DefaultMaxFrameSize caps the frames (and reassembled fragmented
	// NOTIFYs) the agent accepts: route's largest max_body (64 MiB) plus room
	// for headers, so any tune.bufsize the renderer picks fits. HAProxy's
	// max-frame-size defaults to tune.bufsize-4; the smaller one is used.
	DefaultMaxFrameSize = 64<<20 + 64<<10
	// keepBufSize: buffers for larger frames are dropped after use instead
	// of staying with the connection.
	keepBufSize = 1 << 20
	// readBufSize frames up to this size are decided in place, without a copy.
	readBufSize = 64 << 10
	// workerIdle is how long an idle worker goroutine waits for more frames.
	workerIdle = 10 * time.Second
	// helloTimeout bounds the wait for HAPROXY-HELLO on a new connection.
	helloTimeout = 5 * time.Second
)

const (
	spopVersion = "2.0"
	// fragmentation: HAProxy may split a NOTIFY whose body does not fit in
	// one frame, and the agent reassembles it.
	agentCaps = "pipelining,fragmentation"
)

// Options configure an Agent.
type Options struct {
	Log *zerolog.Logger
	// MaxFrameSize caps the frame size (default DefaultMaxFrameSize). It also
	// bounds a reassembled fragmented NOTIFY.
	MaxFrameSize int
}

// Stats are counters for tests and logs.
type Stats struct {
	Conns, Notifies, Fragmented uint64
	// Errors counts connections dropped for a protocol error or a panic.
	Errors uint64
}

// Agent serves SPOP connections from HAProxy.
type Agent struct {
	srv      *route.Decider
	log      *zerolog.Logger
	maxFrame int
	nm       atomic.Pointer[names]
	work     chan job

	conns, notifies, fragmented, errs atomic.Uint64
	// late tells the messages HAProxy gave up on before they were read (late.go).
	late lateness
}

// decider is a decider of this agent's messages.
func (a *Agent) decider() *decider {
	d := newDecider(a.srv, a.names)
	d.late = &a.late
	return d
}

// New builds an agent that decides with srv.
func New(srv *route.Decider, opts Options) *Agent {
	if opts.Log == nil {
		l := zerolog.Nop()
		opts.Log = &l
	}
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	return &Agent{srv: srv, log: opts.Log, maxFrame: max(opts.MaxFrameSize, minFrameSize), work: make(chan job)}
}

// Stats returns the counters.
func (a *Agent) Stats() Stats {
	return Stats{Conns: a.conns.Load(), Notifies: a.notifies.Load(), Fragmented: a.fragmented.Load(), Errors: a.errs.Load()}
}

// names returns the header set for the live config, rebuilt only when the
// config changes.
func (a *Agent) names(snap *route.Snapshot) *names {
	if n := a.nm.Load(); n != nil && n.cfg == snap.Config {
		return n
	}
	n := newNames(snap)
	a.nm.Store(n)
	return n
}

// Serve accepts connections until ctx ends (then it says goodbye on every
// connection with AGENT-DISCONNECT, closes them and returns nil) or Accept
// fails.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	var (
		mu    sync.Mutex
		open  = map[*conn]struct{}{}
		wg    sync.WaitGroup
		ended = make(chan struct{})
	)
	go func() {
		select {
		case <-ctx.Done():
		case <-ended:
		}
		ln.Close()
		mu.Lock()
		for c := range open {
			c.goodbye()
		}
		mu.Unlock()
	}()
	defer func() {
		close(ended)
		wg.Wait()
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("spoe accept: %w", err)
		}
		a.conns.Add(1)
		c := a.newConn(nc)
		mu.Lock()
		open[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.serveConn(ctx, c)
			mu.Lock()
			delete(open, c)
			mu.Unlock()
		}()
	}
}

// conn is one SPOP connection.
type conn struct {
	a        *Agent
	nc       net.Conn
	br       *bufio.Reader
	maxFrame int
	// skip is what the last frame left in br (it was decided in place).
	skip int
	// big holds frames larger than br's buffer.
	big []byte
	// frag reassembles a fragmented NOTIFY; fragID is its stream and frame id.
	frag   []byte
	fragID header
	inFrag bool

	wmu sync.Mutex
	bw  *bufio.Writer

	d   *decider
	out []byte
	// ended is set when the connection's reader stops: what was decided
	// for it can no longer be answered.
	ended atomic.Bool
}

// Gone reports whether the connection ended (flow control drops what it
// holds for it; HAProxy 2.6 sends no per-frame cancel).
func (c *conn) Gone() bool { return c.ended.Load() }

// errDisconnect carries the status sent in AGENT-DISCONNECT.
type errDisconnect struct {
	status uint32
	err    error
}

func (e *errDisconnect) Error() string { return e.err.Error() }
func (e *errDisconnect) Unwrap() error { return e.err }

func protoErr(status uint32, format string, args ...any) error {
	return &errDisconnect{status: status, err: fmt.Errorf(format, args...)}
}

func (a *Agent) newConn(nc net.Conn) *conn {
	return &conn{
		a:  a,
		nc: nc,
		br: bufio.NewReaderSize(nc, readBufSize),
		bw: bufio.NewWriterSize(nc, 16<<10),
		// Until the handshake, only a HELLO-sized frame is accepted: a stray
		// client cannot make the agent allocate max-frame-size buffers.
		maxFrame: min(a.maxFrame, readBufSize),
	}
}

// goodbye tells HAProxy the agent is going away, then closes the
// connection (which ends its reader).
func (c *conn) goodbye() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.bw.Write(appendAgentDisconnect(nil, statusNormal, "turnout is shutting down"))
	_ = c.bw.Flush()
	c.nc.Close()
}

func (a *Agent) serveConn(ctx context.Context, c *conn) {
	nc := c.nc
	defer nc.Close()
	defer c.ended.Store(true)
	log := a.log.With().Str(fieldRemote, nc.RemoteAddr().String()).Logger()
	err := c.run(ctx)
	var de *errDisconnect
	switch {
	case err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
		log.Debug().Msg("spoe connection closed")
	case errors.As(err, &de):
		a.errs.Add(1)
		log.Warn().Err(err).Uint32(fieldStatus, de.status).Msg("spoe protocol error; disconnecting")
		c.wmu.Lock()
		_, _ = c.bw.Write(appendAgentDisconnect(nil, de.status, de.err.Error()))
		_ = c.bw.Flush()
		c.wmu.Unlock()
	default:
		// Resets and timeouts: HAProxy reconnects when it needs to.
		log.Debug().Err(err).Msg("spoe connection ended")
	}
}

func (c *conn) run(ctx context.Context) (err error) {
	defer func() {
		// A panic in a decision must not take turnout down: drop this
		// connection (HAProxy fails its in-flight streams over to its
		// set-on-error rules and reconnects).
		if r := recover(); r != nil {
			err = protoErr(statusUnknown, "panic in a decision: %v", r)
		}
	}()
	_ = c.nc.SetReadDeadline(time.Now().Add(helloTimeout))
	healthcheck, err := c.hello()
	if err != nil || healthcheck {
		return err
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	c.d = c.a.decider()
	for {
		frame, err := c.readFrame()
		if err != nil {
			return err
		}
		h, payload, err := readHeader(frame)
		if err != nil {
			return protoErr(statusInvalid, "frame header: %w", err)
		}
		switch h.Type {
		case frameNotify, frameUnset:
			if err := c.notify(h, payload); err != nil {
				return err
			}
		case frameHAProxyDisconnect:
			c.disconnected(payload)
			c.wmu.Lock()
			_, _ = c.bw.Write(appendAgentDisconnect(c.out[:0], statusNormal, "bye"))
			err := c.bw.Flush()
			c.wmu.Unlock()
			return err
		default:
			// SPOE.txt: unknown frames may be silently skipped.
		}
		if c.br.Buffered() <= c.skip {
			// Nothing more has arrived: send the ACKs of this burst.
			c.wmu.Lock()
			err := c.bw.Flush()
			c.wmu.Unlock()
			if err != nil {
				return fmt.Errorf("spoe write: %w", err)
			}
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// readFrame returns the next frame without its length. Frames that fit in
// the read buffer are views valid until the next call.
func (c *conn) readFrame() ([]byte, error) {
	if c.skip > 0 {
		_, _ = c.br.Discard(c.skip)
		c.skip = 0
	}
	if cap(c.big) > keepBufSize {
		c.big = nil
	}
	if !c.inFrag && cap(c.frag) > keepBufSize {
		c.frag = nil
	}
	lb, err := c.br.Peek(4)
	if err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(lb))
	_, _ = c.br.Discard(4)
	if n > c.maxFrame || n < 1 {
		return nil, protoErr(statusTooBig, "frame of %d bytes (max-frame-size %d)", n, c.maxFrame)
	}
	if n <= c.br.Size() {
		b, err := c.br.Peek(n)
		if err != nil {
			return nil, unexpected(err)
		}
		c.skip = n
		return b, nil
	}
	if cap(c.big) < n {
		c.big = make([]byte, n)
	}
	c.big = c.big[:n]
	if _, err := io.ReadFull(c.br, c.big); err != nil {
		return nil, unexpected(err)
	}
	return c.big, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// hello runs the HELLO handshake.
func (c *conn) hello() (healthcheck bool, err error) {
	frame, err := c.readFrame()
	if err != nil {
		return false, err
	}
	h, payload, err := readHeader(frame)
	if err != nil {
		return false, protoErr(statusInvalid, "hello header: %w", err)
	}
	if h.Type != frameHAProxyHello {
		return false, protoErr(statusInvalid, "first frame has type %d, want HAPROXY-HELLO", h.Type)
	}
	var versionOK, sizeOK bool
	it := kvIter{b: payload}
	for it.next() {
		switch string(it.Name) {
		case "supported-versions":
			versionOK = supportsV2(it.Value.Bytes)
		case "max-frame-size":
			// HAProxy sends a UINT32; only one of Uint/Int is ever set.
			sizeOK = true
			c.maxFrame = min(int(it.Value.Uint)+int(it.Value.Int), c.a.maxFrame)
		case "healthcheck":
			healthcheck = it.Value.Bool
		}
	}
	switch {
	case it.err != nil:
		return false, protoErr(statusInvalid, "hello: %w", it.err)
	case !versionOK:
		return false, protoErr(statusBadVersion, "no supported SPOP version (want 2.x)")
	case !sizeOK:
		return false, protoErr(statusNoFrameSize, "hello without max-frame-size")
	case c.maxFrame < minFrameSize:
		return false, protoErr(statusBadFrameSize, "max-frame-size %d below %d", c.maxFrame, minFrameSize)
	}
	c.out = appendAgentHello(make([]byte, 0, 256), spopVersion, uint32(c.maxFrame), agentCaps)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.bw.Write(c.out); err != nil {
		return false, fmt.Errorf("spoe write hello: %w", err)
	}
	if err := c.bw.Flush(); err != nil {
		return false, fmt.Errorf("spoe write hello: %w", err)
	}
	return healthcheck, nil
}

// supportsV2 reports whether a "supported-versions" list has a 2.x version.
func supportsV2(list []byte) bool {
	for v := range strings.SplitSeq(unsafeString(list), ",") {
		if strings.HasPrefix(strings.TrimSpace(v), "2.") {
			return true
		}
	}
	return false
}

// notify handles a NOTIFY frame or one of its fragments.
func (c *conn) notify(h header, payload []byte) error {
	if h.Type == frameUnset || h.Flags&flagFin == 0 {
		return c.fragment(h, payload)
	}
	if c.inFrag {
		return protoErr(statusInterlaced, "NOTIFY %d/%d inside fragmented frame %d/%d", h.StreamID, h.FrameID, c.fragID.StreamID, c.fragID.FrameID)
	}
	return c.dispatch(h, payload)
}

// fragment collects the pieces of a fragmented NOTIFY (HAProxy sends them
// back to back on one connection; a new frame in between is an error).
func (c *conn) fragment(h header, payload []byte) error {
	switch {
	case h.Type == frameNotify && c.inFrag:
		return protoErr(statusInterlaced, "new NOTIFY %d/%d inside fragmented frame", h.StreamID, h.FrameID)
	case h.Type == frameNotify:
		c.inFrag, c.fragID, c.frag = true, h, append(c.frag[:0], payload...)
		return nil
	case !c.inFrag || h.StreamID != c.fragID.StreamID || h.FrameID != c.fragID.FrameID:
		return protoErr(statusFragNotSupp, "fragment %d/%d of no open frame", h.StreamID, h.FrameID)
	}
	if h.Flags&flagAbort != 0 {
		// HAProxy gave up on this frame (stream aborted): no ACK is expected.
		c.inFrag = false
		return nil
	}
	if len(c.frag)+len(payload) > c.a.maxFrame {
		return protoErr(statusTooBig, "fragmented NOTIFY over %d bytes", c.a.maxFrame)
	}
	c.frag = append(c.frag, payload...)
	if h.Flags&flagFin == 0 {
		return nil
	}
	c.inFrag = false
	c.a.fragmented.Add(1)
	return c.dispatch(c.fragID, c.frag)
}

// dispatch decides inline, or hands a copy of the frame to a worker when
// decisions may block.
func (c *conn) dispatch(h header, payload []byte) error {
	c.a.notifies.Add(1)
	if c.d.names(c.a.srv.Snapshot()).blocking {
		buf := getBuf(len(payload))
		*buf = append((*buf)[:0], payload...)
		c.a.submit(job{c: c, h: h, payload: *buf, buf: buf})
		return nil
	}
	var err error
	c.out, err = ack(c.d, h, payload, c.out[:0], c.maxFrame)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	_, err = c.bw.Write(c.out)
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("spoe write: %w", err)
	}
	return nil
}

// ack builds the ACK frame for a NOTIFY.
func ack(d *decider, h header, payload, dst []byte, maxFrame int) ([]byte, error) {
	dst = beginFrame(dst, frameAck, flagFin, h.StreamID, h.FrameID)
	// 4 bytes of length are not part of the frame.
	dst, err := d.notify(payload, dst, maxFrame+4)
	if err != nil {
		return nil, protoErr(statusInvalid, "NOTIFY %d/%d: %w", h.StreamID, h.FrameID, err)
	}
	return endFrame(dst), nil
}

func (c *conn) disconnected(payload []byte) {
	var status uint64
	var msg []byte
	it := kvIter{b: payload}
	for it.next() {
		switch string(it.Name) {
		case "status-code":
			status = it.Value.Uint + uint64(it.Value.Int)
		case "message":
			msg = it.Value.Bytes
		}
	}
	ev := c.a.log.Debug()
	if status != uint64(statusNormal) && status != uint64(statusIO) && status != uint64(statusTimeout) {
		ev = c.a.log.Warn()
	}
	ev.Uint64(fieldStatus, status).Bytes("message", msg).Msg("HAProxy closed the spoe connection")
}

// job is a NOTIFY handed to a worker.
type job struct {
	c       *conn
	h       header
	payload []byte
	buf     *[]byte
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

func getBuf(n int) *[]byte {
	b := bufPool.Get().(*[]byte)
	if cap(*b) < n {
		*b = make([]byte, 0, n)
	}
	return b
}

// submit gives j to an idle worker or starts one: blocking decisions then
// never wait for each other, and the workers shrink back when idle.
func (a *Agent) submit(j job) {
	select {
	case a.work <- j:
	default:
		go a.worker(j)
	}
}

func (a *Agent) worker(j job) {
	d := a.decider()
	var out []byte
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		out = a.runJob(d, j, out)
		// Go >= 1.23 timers: Reset never delivers a stale tick.
		t.Reset(workerIdle)
		select {
		case j = <-a.work:
		case <-t.C:
			return
		}
	}
}

func (a *Agent) runJob(d *decider, j job, out []byte) []byte {
	defer putBuf(j.buf)
	c := j.c
	defer func() {
		// As on the inline path, a panic drops the connection, not turnout.
		if r := recover(); r != nil {
			a.errs.Add(1)
			a.log.Error().Interface("panic", r).Msg("spoe: panic in a decision; closing the connection")
			c.nc.Close()
		}
	}()
	d.watch = c
	out, err := ack(d, j.h, j.payload, out[:0], c.maxFrame)
	d.watch = nil
	if err != nil {
		a.errs.Add(1)
		a.log.Warn().Err(err).Msg("spoe: bad NOTIFY; closing the connection")
		c.nc.Close()
		return out
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.bw.Write(out); err == nil {
		_ = c.bw.Flush()
	}
	return out
}

func putBuf(b *[]byte) {
	if cap(*b) <= 1<<20 {
		bufPool.Put(b)
	}
}

// unsafeString views b as a string for parsing; it must not be kept.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
