package epp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/status"
)

// The inline server (epp.server: inline): HTTP/2 and gRPC written here for
// exactly the ext_proc Process stream and the unary health Check, so a
// connection's frames are decided on its own goroutine, as the SPOE agent
// does. grpc-go hands every message from its reader goroutine to the
// stream's handler and every answer to its writer goroutine: two context
// switches per decision, which cost more than the decision itself.
//
// One goroutine per connection reads frames and answers them; answers are
// buffered and flushed when no more input is buffered (a burst's answers
// go out together). A stream whose decision can wait (a deployment with
// flow control) runs on a goroutine of its own fed by the loop, and writes
// under the connection's write lock. Writes respect the peer's windows:
// what does not fit waits in its stream's queue until a WINDOW_UPDATE, and
// the loop goes on.

// The gRPC methods served.
const (
	pathProcess     = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
	pathHealthCheck = "/grpc.health.v1.Health/Check"
)

// h2Server serves the inline Endpoint Picker on a listener.
type h2Server struct {
	s      *Server
	hs     *health.Server
	tlsCfg *tls.Config // nil: h2c

	mu       sync.Mutex
	conns    map[*h2Conn]struct{}
	stopping bool
	wg       sync.WaitGroup
}

func newH2Server(s *Server, hs *health.Server, tlsCfg *tls.Config) *h2Server {
	if tlsCfg != nil {
		tlsCfg = tlsCfg.Clone()
		tlsCfg.NextProtos = []string{http2.NextProtoTLS}
	}
	return &h2Server{s: s, hs: hs, tlsCfg: tlsCfg, conns: map[*h2Conn]struct{}{}}
}

// serve accepts connections until ln is closed.
func (h *h2Server) serve(ln net.Listener) error {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			h.mu.Lock()
			stopping := h.stopping
			h.mu.Unlock()
			if stopping || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if h.tlsCfg != nil {
			nc = tls.Server(nc, h.tlsCfg)
		}
		c := newH2Conn(h, nc)
		h.mu.Lock()
		if h.stopping {
			h.mu.Unlock()
			_ = nc.Close()
			continue
		}
		h.conns[c] = struct{}{}
		h.wg.Add(1)
		h.mu.Unlock()
		go func() {
			defer h.wg.Done()
			c.serve()
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
		}()
	}
}

// shutdown sends GOAWAY on every connection, waits for their streams to
// end until ctx ends, then closes them.
func (h *h2Server) shutdown(ctx context.Context, ln net.Listener) {
	h.mu.Lock()
	h.stopping = true
	conns := make([]*h2Conn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	_ = ln.Close()
	for _, c := range conns {
		c.goAway()
	}
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		h.mu.Lock()
		for c := range h.conns {
			_ = c.nc.Close()
		}
		h.mu.Unlock()
		<-done
	}
}

// The windows this side advertises are the grpc-go server's (server.go):
// a request body up to streamWindow is read without an update.
const (
	defaultWindow = 65535
	maxFrame      = 16384 // the protocol's default; answers are cut to the peer's
)

// connBuf is a connection's read and write buffer: one read takes the
// requests of several streams, one write their answers (a gateway keeps
// a few connections, each with many streams).
const connBuf = 64 << 10

// h2Conn is one connection: read and decided by serve's goroutine.
type h2Conn struct {
	h  *h2Server
	nc net.Conn
	br *bufio.Reader
	fr *http2.Framer

	// Loop-only state.
	streams  map[uint32]*h2Stream
	lastID   atomic.Uint32 // the last stream opened (GOAWAY names it)
	recvConn int           // bytes received since the last connection WINDOW_UPDATE
	spareIn  [][]byte
	spareSt  []*h2Stream // ended streams, kept for the next ones
	req      procReq     // the message being handled
	hdec     *hpack.Decoder
	hblock   []byte       // a header block continued in CONTINUATION frames
	hstream  uint32       // its stream; 0: no block is open
	hended   bool         // its HEADERS frame ended the stream
	hf       headerFields // the header block being decoded

	// Write state, under wmu.
	wmu         sync.Mutex
	bw          *bufio.Writer
	henc        *hpack.Encoder
	hbuf        bytes.Buffer
	sendConn    int64 // the peer's connection window
	peerWindow  int64 // the peer's initial stream window
	peerFrame   int   // the peer's max frame size
	parked      map[uint32]*h2Stream
	reap        []uint32 // streams ended: the loop forgets them at its next flush
	fhdr        [9]byte  // a DATA frame's header being written
	scratch     []byte   // a streamed answer's head being written
	spareOut    [][]byte
	goneAway    bool
	broken      bool // a write failed: the connection is closing
	streamCount int  // open streams, for the GOAWAY drain
	drained     chan struct{}
}

func newH2Conn(h *h2Server, nc net.Conn) *h2Conn {
	c := &h2Conn{h: h, nc: nc, br: bufio.NewReaderSize(nc, connBuf), bw: bufio.NewWriterSize(nc, connBuf),
		streams: map[uint32]*h2Stream{}, parked: map[uint32]*h2Stream{},
		sendConn: defaultWindow, peerWindow: defaultWindow, peerFrame: maxFrame}
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	c.hdec = hpack.NewDecoder(4096, c.headerField)
	c.hdec.SetMaxStringLength(maxHeaderList)
	c.henc = hpack.NewEncoder(&c.hbuf)
	return c
}

func (c *h2Conn) serve() {
	defer c.close()
	if tc, ok := c.nc.(*tls.Conn); ok {
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			c.h.s.log.Debug().Err(err).Msg("Endpoint Picker TLS handshake failed")
			return
		}
		_ = tc.SetDeadline(time.Time{})
	}
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.br, preface); err != nil || string(preface) != http2.ClientPreface {
		c.h.s.log.Debug().Err(err).Msg("Endpoint Picker connection without the HTTP/2 preface")
		return
	}
	c.wmu.Lock()
	err := c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrame},
	)
	if err == nil {
		err = c.fr.WriteWindowUpdate(0, connWindow-defaultWindow)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		return
	}
	for {
		taken, err := c.dataInPlace()
		if err != nil {
			c.h.s.log.Debug().Err(err).Msg("Endpoint Picker connection closed")
			c.connError(err)
			return
		}
		if taken {
			if !c.maybeFlush() {
				return
			}
			continue
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.resetStream(se.StreamID, se.Code)
				continue
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.h.s.log.Debug().Err(err).Msg("Endpoint Picker connection: bad frame")
				c.connError(err)
			}
			return
		}
		if err := c.frame(f); err != nil {
			c.h.s.log.Debug().Err(err).Msg("Endpoint Picker connection closed")
			c.connError(err)
			return
		}
		if !c.maybeFlush() {
			return
		}
	}
}

// maybeFlush flushes the answers once no more input is buffered (a burst's
// answers go out together) and forgets the streams that ended; false: the
// connection broke.
func (c *h2Conn) maybeFlush() bool {
	if c.br.Buffered() > 0 || c.tlsBuffered() {
		return true
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := c.bw.Flush()
	for _, id := range c.reap {
		if st := c.streams[id]; st != nil {
			delete(c.streams, id)
			c.recycle(st)
		}
	}
	c.reap = c.reap[:0]
	return err == nil
}

// dataInPlace handles the next frame when it is a plain DATA frame whole
// in the read buffer, from the buffer's bytes: the framer would copy its
// payload once more. Any other frame (padded, on stream 0, larger than
// the frame size advertised, inside a header block) is left to the
// framer.
func (c *h2Conn) dataInPlace() (taken bool, err error) {
	hdr, err := c.br.Peek(9)
	if err != nil || http2.FrameType(hdr[3]) != http2.FrameData || c.hstream != 0 {
		return false, nil // the framer reads the error, or the frame
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	flags := http2.Flags(hdr[4])
	id := binary.BigEndian.Uint32(hdr[5:]) & (1<<31 - 1)
	if id == 0 || n > maxFrame || flags.Has(http2.FlagDataPadded) {
		return false, nil
	}
	p, err := c.br.Peek(9 + n)
	if err != nil {
		return false, nil
	}
	err = c.data(id, p[9:], n, flags.Has(http2.FlagDataEndStream))
	_, _ = c.br.Discard(9 + n)
	return true, err
}

// tlsBuffered reports whether the TLS connection holds more input already
// read from the socket (crypto/tls reads as much as has come, and hands
// it on one record at a time): a read that cannot wait takes it into br,
// so a burst's answers are flushed once after all of it, as over h2c. A
// read past its deadline makes no system call and leaves crypto/tls's
// state as it was.
func (c *h2Conn) tlsBuffered() bool {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return false
	}
	_ = tc.SetReadDeadline(time.Unix(1, 0))
	_, err := c.br.Peek(1)
	_ = tc.SetReadDeadline(time.Time{})
	return err == nil
}

// connError tells the client why the connection ends, when err is the
// protocol's connection error.
func (c *h2Conn) connError(err error) {
	var ce http2.ConnectionError
	if !errors.As(err, &ce) {
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.broken {
		_ = c.fr.WriteGoAway(c.lastID.Load(), http2.ErrCode(ce), nil)
		_ = c.bw.Flush()
	}
}

// close ends every stream still open (as a client cancel) and the socket.
func (c *h2Conn) close() {
	for id, st := range c.streams {
		st.cancelStream()
		delete(c.streams, id)
	}
	c.wmu.Lock()
	c.broken = true
	c.wmu.Unlock()
	_ = c.nc.Close()
}

// frame handles one frame on the loop.
func (c *h2Conn) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		return c.settings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		c.wmu.Lock()
		defer c.wmu.Unlock()
		return c.fr.WritePing(true, f.Data)
	case *http2.WindowUpdateFrame:
		c.windowUpdate(f.StreamID, int64(f.Increment))
		return nil
	case *http2.HeadersFrame:
		if f.HeadersEnded() {
			return c.headerBlock(f.StreamID, f.StreamEnded(), f.HeaderBlockFragment())
		}
		c.hblock = append(c.hblock[:0], f.HeaderBlockFragment()...)
		c.hstream, c.hended = f.StreamID, f.StreamEnded()
		return nil
	case *http2.ContinuationFrame:
		// The framer has checked that it continues c.hstream's block.
		if len(c.hblock)+len(f.HeaderBlockFragment()) > maxHeaderList {
			return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
		}
		c.hblock = append(c.hblock, f.HeaderBlockFragment()...)
		if !f.HeadersEnded() {
			return nil
		}
		block, id := c.hblock, c.hstream
		c.hblock, c.hstream = c.hblock[:0], 0
		return c.headerBlock(id, c.hended, block)
	case *http2.DataFrame:
		return c.data(f.StreamID, f.Data(), int(f.Length), f.StreamEnded()) // padding counts in flow control
	case *http2.RSTStreamFrame:
		if st := c.streams[f.StreamID]; st != nil {
			delete(c.streams, f.StreamID)
			st.cancelStream()
			c.dropInput(st)
		}
		return nil
	case *http2.GoAwayFrame:
		return nil // the client stops opening streams; open ones run on
	default:
		return nil // PRIORITY, unknown frames: ignored, as the protocol says
	}
}

func (c *h2Conn) settings(f *http2.SettingsFrame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err // a frame size out of 16 KiB-16 MiB, a window over 2^31-1
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWindow
			c.peerWindow = int64(s.Val)
			for _, st := range c.streams {
				st.sendWindow += delta
			}
		case http2.SettingMaxFrameSize:
			c.peerFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := c.fr.WriteSettingsAck(); err != nil {
		return err
	}
	c.flushParkedLocked()
	return nil
}

func (c *h2Conn) windowUpdate(id uint32, inc int64) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if id == 0 {
		c.sendConn += inc
		c.flushParkedLocked()
		return
	}
	if st := c.parked[id]; st != nil {
		st.sendWindow += inc
		c.writeOutLocked(st)
		return
	}
	if st := c.streams[id]; st != nil {
		st.sendWindow += inc
	}
}

// flushParkedLocked writes what the windows now let through.
func (c *h2Conn) flushParkedLocked() {
	for _, st := range c.parked {
		if c.sendConn <= 0 {
			return
		}
		c.writeOutLocked(st)
	}
}

// headerFields are the fields of a header block the server reads.
type headerFields struct {
	path, method, ctype, enc string
	size                     int
}

// maxHeaderList bounds a header block, and the fields read of it.
const maxHeaderList = 1 << 20

// headerField is the HPACK decoder's: it keeps the fields the server reads.
func (c *h2Conn) headerField(f hpack.HeaderField) {
	if c.hf.size += int(f.Size()); c.hf.size > maxHeaderList {
		return
	}
	switch f.Name {
	case ":path":
		c.hf.path = f.Value
	case ":method":
		c.hf.method = f.Value
	case "content-type":
		c.hf.ctype = f.Value
	case "grpc-encoding":
		c.hf.enc = f.Value
	}
}

// headerBlock decodes a whole header block of stream id (every block is
// decoded: HPACK's table is the connection's).
func (c *h2Conn) headerBlock(id uint32, ended bool, block []byte) error {
	c.hf = headerFields{}
	if _, err := c.hdec.Write(block); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if err := c.hdec.Close(); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	return c.headers(id, ended)
}

// headers opens a stream.
func (c *h2Conn) headers(id uint32, ended bool) error {
	if c.streams[id] != nil {
		// Trailers from the client: they end its half of the stream.
		if ended {
			c.endOfInput(c.streams[id])
		}
		return nil
	}
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if id <= c.lastID.Load() {
		return nil // a stream that ended: its late headers change nothing
	}
	c.wmu.Lock()
	gone, window := c.goneAway, c.peerWindow
	if !gone {
		c.lastID.Store(id)
		c.streamCount++
	}
	c.wmu.Unlock()
	if gone {
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return nil
	}
	path, ctype, method, enc := c.hf.path, c.hf.ctype, c.hf.method, c.hf.enc
	st := c.newStream(id, window)
	c.streams[id] = st
	switch {
	case method != "POST" || !isGRPC(ctype):
		st.httpRefuse()
		return nil
	case enc != "" && enc != "identity":
		st.ended = true
		st.finish(status.New(codes.Unimplemented, "turnout Endpoint Picker: compressed messages (grpc-encoding "+enc+") are not supported: send them uncompressed"))
		return nil
	case path == pathProcess:
		st.kind = kindProcess
		st.startProcess()
	case path == pathHealthCheck:
		st.kind = kindHealth
	default:
		st.ended = true
		st.finish(status.New(codes.Unimplemented, "turnout Endpoint Picker: unknown method "+path))
		return nil
	}
	if ended {
		c.endOfInput(st)
	}
	return nil
}

func isGRPC(ctype string) bool {
	const g = "application/grpc"
	return len(ctype) >= len(g) && ctype[:len(g)] == g && (len(ctype) == len(g) || ctype[len(g)] == '+' || ctype[len(g)] == ';')
}

// data takes a DATA frame's bytes into its stream's messages; n is the
// frame's length, its padding included (flow control counts it).
func (c *h2Conn) data(id uint32, data []byte, n int, ended bool) error {
	c.recvConn += n
	if c.recvConn >= connWindow/4 {
		c.wmu.Lock()
		err := c.fr.WriteWindowUpdate(0, uint32(c.recvConn))
		c.wmu.Unlock()
		if err != nil {
			return err
		}
		c.recvConn = 0
	}
	st := c.streams[id]
	if st == nil || st.inputDone {
		return nil
	}
	st.recvUsed += n
	if st.recvUsed >= streamWindow/4 && !ended {
		c.wmu.Lock()
		err := c.fr.WriteWindowUpdate(st.id, uint32(st.recvUsed))
		c.wmu.Unlock()
		if err != nil {
			return err
		}
		st.recvUsed = 0
	}
	if st.in == nil {
		st.in, c.spareIn = takeBuf(c.spareIn)
	}
	st.in = append(st.in, data...)
	st.messages()
	if ended && c.streams[id] == st {
		c.endOfInput(st)
	}
	return nil
}

// endOfInput: the client half-closed the stream.
func (c *h2Conn) endOfInput(st *h2Stream) {
	if st.inputDone {
		return
	}
	st.inputDone = true
	if len(st.in) > st.inOff {
		st.fail(status.New(codes.Internal, "turnout Endpoint Picker: the stream ended inside a message"))
	} else {
		st.eof()
	}
	c.dropInput(st)
}

// dropInput keeps an ended stream's input buffer for the next streams
// (nothing views it once the stream's input ended or the stream was reset).
func (c *h2Conn) dropInput(st *h2Stream) {
	c.spareIn, st.in, st.inOff = keepBuf(c.spareIn, st.in), nil, 0
}

// resetStream sends RST_STREAM and forgets the stream.
func (c *h2Conn) resetStream(id uint32, code http2.ErrCode) {
	if st := c.streams[id]; st != nil {
		delete(c.streams, id)
		st.cancelStream()
	}
	c.wmu.Lock()
	_ = c.fr.WriteRSTStream(id, code)
	c.wmu.Unlock()
}

// goAway tells the client no new stream is taken; the connection closes
// when its open streams end.
func (c *h2Conn) goAway() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.goneAway || c.broken {
		return
	}
	c.goneAway = true
	_ = c.fr.WriteGoAway(c.lastID.Load(), http2.ErrCodeNo, nil)
	_ = c.bw.Flush()
	c.maybeCloseLocked()
}

// streamDoneLocked counts a stream out; after GOAWAY the last one closes
// the connection.
func (c *h2Conn) streamDoneLocked() {
	c.streamCount--
	c.maybeCloseLocked()
}

func (c *h2Conn) maybeCloseLocked() {
	if c.goneAway && c.streamCount <= 0 {
		_ = c.bw.Flush()
		// The loop ends on the read error; the client sees GOAWAY and EOF.
		if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_ = c.nc.Close()
	}
}

// writeHeadersLocked writes a header block on id.
func (c *h2Conn) writeHeadersLocked(id uint32, end bool, kv ...string) error {
	c.hbuf.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := c.henc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]}); err != nil {
			return err
		}
	}
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: end, EndHeaders: true})
}

// The header blocks every answered stream sends, encoded once: literals
// without indexing leave the connection's HPACK table as it is.
const (
	// :status 200 (static index 8), content-type (static index 31)
	// application/grpc.
	hpackHeaders = "\x88" + "\x0f\x10\x10application/grpc"
	// grpc-status 0, grpc-message empty.
	hpackTrailersOK = "\x00\x0bgrpc-status\x010" + "\x00\x0cgrpc-message\x00"
)

// writeBlockLocked writes an encoded header block on id.
func (c *h2Conn) writeBlockLocked(id uint32, end bool, block string) error {
	c.hbuf.Reset()
	c.hbuf.WriteString(block)
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: end, EndHeaders: true})
}

// writeDataLocked writes a DATA frame (not ending the stream) straight
// into the connection's buffer: the framer would copy p once more.
func (c *h2Conn) writeDataLocked(id uint32, p []byte) error {
	if err := c.writeDataHeaderLocked(id, len(p)); err != nil {
		return err
	}
	_, err := c.bw.Write(p)
	return err
}

// writeDataHeaderLocked writes the header of a DATA frame of n bytes (not
// ending the stream); its payload follows.
func (c *h2Conn) writeDataHeaderLocked(id uint32, n int) error {
	h := &c.fhdr // a local would escape to the heap through bufio's writer
	*h = [9]byte{byte(n >> 16), byte(n >> 8), byte(n), byte(http2.FrameData), 0}
	binary.BigEndian.PutUint32(h[5:], id)
	_, err := c.bw.Write(h[:])
	return err
}

// writeChunkLocked writes a streamed answer (a body chunk passed on) as
// one DATA frame from the chunk's own bytes, when nothing of st's waits
// and the windows and the peer's frame size take it whole: the chunk is
// not copied into st's queue first. sent false: st's queue takes it.
func (c *h2Conn) writeChunkLocked(st *h2Stream, a *answer) (sent bool, err error) {
	if len(st.out) > 0 || a.kind != answerStreamed || len(a.chunk) == 0 {
		return false, nil
	}
	c.scratch = a.appendHead(append(c.scratch[:0], 0, 0, 0, 0, 0))
	msg := len(c.scratch) - 5 + len(a.chunk)
	if a.eos {
		msg += len(appendEOS(nil))
	}
	n := 5 + msg
	if n > c.peerFrame || int64(n) > min(st.sendWindow, c.sendConn) {
		return false, nil
	}
	binary.BigEndian.PutUint32(c.scratch[1:], uint32(msg))
	if err = c.writeDataHeaderLocked(st.id, n); err == nil {
		_, err = c.bw.Write(c.scratch)
	}
	if err == nil {
		_, err = c.bw.Write(a.chunk)
	}
	if err == nil && a.eos {
		c.scratch = appendEOS(c.scratch[:0])
		_, err = c.bw.Write(c.scratch)
	}
	if err != nil {
		c.broken = true
		return false, err
	}
	st.sendWindow -= int64(n)
	c.sendConn -= int64(n)
	return true, nil
}

// writeOutLocked writes st's queued answer bytes as the windows allow,
// then its trailers once the queue is empty.
func (c *h2Conn) writeOutLocked(st *h2Stream) {
	if c.broken {
		return
	}
	for st.outOff < len(st.out) {
		n := min(len(st.out)-st.outOff, c.peerFrame, int(min(st.sendWindow, c.sendConn)))
		if n <= 0 {
			c.parked[st.id] = st
			return
		}
		if err := c.writeDataLocked(st.id, st.out[st.outOff:st.outOff+n]); err != nil {
			c.broken = true
			return
		}
		st.outOff += n
		st.sendWindow -= int64(n)
		c.sendConn -= int64(n)
	}
	st.out, st.outOff = st.out[:0], 0
	delete(c.parked, st.id)
	if st.ending && !st.closed {
		st.closed = true
		c.spareOut, st.out = keepBuf(c.spareOut, st.out), nil
		var err error
		switch s := st.trailers; {
		case s == nil && st.headersSent:
			err = c.writeBlockLocked(st.id, true, hpackTrailersOK)
		case s == nil:
			err = c.writeBlockLocked(st.id, true, hpackHeaders+hpackTrailersOK)
		case st.headersSent:
			err = c.writeHeadersLocked(st.id, true, "grpc-status", strconv.Itoa(int(s.Code())), "grpc-message", encodeGRPCMessage(s.Message()))
		default:
			err = c.writeHeadersLocked(st.id, true, ":status", "200", "content-type", "application/grpc",
				"grpc-status", strconv.Itoa(int(s.Code())), "grpc-message", encodeGRPCMessage(s.Message()))
		}
		if err == nil && !st.halfClosed.Load() {
			// The client may still be sending: it need not.
			err = c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
		if err != nil {
			c.broken = true
		}
		c.reap = append(c.reap, st.id) // the loop forgets it at its next flush
		c.streamDoneLocked()
	}
}

// newStream is stream id's state, a kept one when there is one.
func (c *h2Conn) newStream(id uint32, window int64) *h2Stream {
	n := len(c.spareSt)
	if n == 0 {
		return &h2Stream{c: c, id: id, sendWindow: window}
	}
	st := c.spareSt[n-1]
	c.spareSt[n-1] = nil
	c.spareSt = c.spareSt[:n-1]
	*st = h2Stream{c: c, id: id, sendWindow: window}
	return st
}

// recycle keeps an ended stream the loop has forgotten for the next
// ones: a stream per request was the server's largest allocation. A
// stream that ran on its own goroutine is not kept (the goroutine may
// still hold it).
func (c *h2Conn) recycle(st *h2Stream) {
	if st.q != nil || st.cancel != nil || len(c.spareSt) >= spareBufs {
		return
	}
	c.spareIn = keepBuf(c.spareIn, st.in)
	*st = h2Stream{}
	c.spareSt = append(c.spareSt, st)
}

// A connection keeps a few of its streams' buffers for the next ones:
// a stream would otherwise grow new ones for each request's messages.
const (
	spareBufs   = 16
	spareBufMax = 64 << 10
)

// keepBuf keeps b, emptied, in spare when it is worth keeping.
func keepBuf(spare [][]byte, b []byte) [][]byte {
	if cap(b) > 0 && cap(b) <= spareBufMax && len(spare) < spareBufs {
		spare = append(spare, b[:0])
	}
	return spare
}

// takeBuf is a kept buffer, or nil.
func takeBuf(spare [][]byte) ([]byte, [][]byte) {
	n := len(spare)
	if n == 0 {
		return nil, spare
	}
	b := spare[n-1]
	spare[n-1] = nil
	return b, spare[:n-1]
}

// encodeGRPCMessage percent-encodes a grpc-message value (gRPC over
// HTTP/2: printable ASCII but %, everything else as %XX).
func encodeGRPCMessage(msg string) string {
	clean := true
	for i := 0; i < len(msg); i++ {
		if b := msg[i]; b < ' ' || b > '~' || b == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(msg)+8)
	for i := 0; i < len(msg); i++ {
		if x := msg[i]; x < ' ' || x > '~' || x == '%' {
			b = append(b, '%', hex[x>>4], hex[x&15])
		} else {
			b = append(b, x)
		}
	}
	return string(b)
}
