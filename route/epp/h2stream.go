package epp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// One stream of the inline server: the gRPC messages of its DATA frames,
// decided on the connection's loop (or fed to the stream's own goroutine
// when a decision can wait), its answers queued against the peer's
// windows, its trailers.

type streamKind uint8

const (
	kindRefused streamKind = iota // answered at once
	kindProcess
	kindHealth
)

// h2Stream is one HTTP/2 stream; as the ext_proc server stream, it is
// what a Process handler sends on.
type h2Stream struct {
	c    *h2Conn
	id   uint32
	kind streamKind

	// Loop-only state: the input not yet made messages, whether the
	// client half-closed, the bytes read since the last WINDOW_UPDATE,
	// whether the answer ended.
	in        []byte
	inOff     int // in[:inOff] is read but kept: the decision views it
	inputDone bool
	recvUsed  int
	ended     bool
	health    []byte // the health Check's request message

	// The ext_proc stream: decided inline (q nil, st is proc) or on its
	// own goroutine reading q (ctx canceled with the stream: flow
	// control's hold watches it).
	st     *stream
	proc   stream
	ctx    context.Context
	cancel context.CancelFunc
	q      *msgQueue

	halfClosed atomic.Bool

	// Write state, under the connection's wmu.
	sendWindow  int64
	out         []byte
	outOff      int
	headersSent bool
	ending      bool           // the trailers are due once out is written
	trailers    *status.Status // their status; nil: OK
	closed      bool
}

var _ msgStream = (*h2Stream)(nil)

// mayHold reports whether a decision can wait (flow control): such a
// stream runs on its own goroutine, not the connection's.
func (s *Server) mayHold() bool {
	for _, dep := range s.d.Snapshot().Deployments {
		if dep.Config.FlowControl != nil {
			return true
		}
	}
	return false
}

func (h *h2Stream) startProcess() {
	if !h.c.h.s.mayHold() {
		// Decided on the loop: nothing waits on the stream's context.
		h.ctx = context.Background()
		h.st = &h.proc
		h.st.init(h.c.h.s, h)
		return
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.q = newMsgQueue()
	go func() {
		err := h.c.h.s.process(h)
		h.finish(statusOf(err))
	}()
}

// messages makes gRPC messages of the input and hands each on. The bytes
// of the messages read stay where they are while the stream's decision
// views them (its Input, the chunks it holds), and make room after.
func (h *h2Stream) messages() {
	off := h.inOff
	for !h.ended && len(h.in)-off >= 5 {
		p := h.in[off:]
		if p[0] != 0 {
			h.fail(status.New(codes.Unimplemented, "turnout Endpoint Picker: compressed messages are not supported: send them uncompressed"))
			return
		}
		n := int(uint32(p[1])<<24 | uint32(p[2])<<16 | uint32(p[3])<<8 | uint32(p[4]))
		if n > maxRecvMsg {
			h.fail(status.Newf(codes.ResourceExhausted, "turnout Endpoint Picker: a message of %d bytes is larger than %d", n, maxRecvMsg))
			return
		}
		if len(p) < 5+n {
			break
		}
		off += 5 + n
		h.message(p[5 : 5+n])
	}
	switch {
	case h.ended:
		h.c.spareIn, h.in, h.inOff = keepBuf(h.c.spareIn, h.in), nil, 0
	case h.st != nil && h.st.viewsInput():
		h.inOff = off
	case off > 0:
		h.in, h.inOff = h.in[:copy(h.in, h.in[off:])], 0
	}
}

// viewsInput reports whether the stream holds views of its messages'
// bytes: the Input until the decision, body chunks until passed on.
func (st *stream) viewsInput() bool { return st.t != nil || len(st.chunks) > 0 }

// message handles one gRPC message; msg is only read during the call.
func (h *h2Stream) message(msg []byte) {
	switch h.kind {
	case kindHealth:
		if h.health != nil {
			h.fail(status.New(codes.Internal, "turnout Endpoint Picker: a unary call with two requests"))
			return
		}
		h.health = append([]byte{}, msg...)
	case kindProcess:
		if h.q != nil {
			h.q.push(append([]byte(nil), msg...)) // read on another goroutine
			return
		}
		req := &h.c.req
		if err := decodeRequest(msg, req); err != nil {
			h.fail(badRequest(err))
			return
		}
		done, err := h.handleInline(req)
		if done || err != nil {
			h.ended = true
			h.st.finish()
			h.finish(statusOf(err))
		}
	}
}

// handleInline is Process's loop body on the connection's goroutine.
func (h *h2Stream) handleInline(req *procReq) (done bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			done, err = true, h.st.panicked(p)
		}
	}()
	return h.st.handle(req)
}

// eof: the client half-closed: a Process stream ends (OK), a health Check
// is answered.
func (h *h2Stream) eof() {
	h.halfClosed.Store(true)
	if h.ended {
		return
	}
	switch h.kind {
	case kindProcess:
		if h.q != nil {
			h.q.end(false)
			return
		}
		h.ended = true
		h.st.finish()
		h.finish(nil)
	case kindHealth:
		h.ended = true
		req := &healthpb.HealthCheckRequest{}
		if h.health == nil {
			h.finish(status.New(codes.Internal, "turnout Endpoint Picker: a unary call without a request"))
			return
		}
		if err := proto.Unmarshal(h.health, req); err != nil {
			h.finish(status.Newf(codes.Internal, "turnout Endpoint Picker: cannot read the HealthCheckRequest: %v", err))
			return
		}
		resp, err := h.c.h.hs.Check(context.Background(), req)
		if err == nil {
			err = h.SendMsg(resp)
		}
		h.finish(statusOf(err))
	}
}

// fail ends the stream on bad input from the client.
func (h *h2Stream) fail(s *status.Status) {
	if h.ended {
		return
	}
	h.ended = true
	if h.q != nil {
		h.finish(s)
		h.q.end(true) // its goroutine releases what it holds
		return
	}
	if h.st != nil {
		h.st.finish()
	}
	h.finish(s)
}

// httpRefuse answers a request that is not gRPC (HTTP 415, as grpc-go).
func (h *h2Stream) httpRefuse() {
	h.ended = true
	c := h.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.writeHeadersLocked(h.id, true, ":status", "415", "content-type", "text/plain"); err != nil {
		c.broken = true
	}
	h.closed = true
	c.streamDoneLocked()
	delete(c.streams, h.id)
}

// finish writes the trailers once the queued answers are out.
func (h *h2Stream) finish(s *status.Status) {
	c := h.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if h.closed || h.ending {
		return
	}
	h.ending, h.trailers = true, s
	c.writeOutLocked(h)
	if h.q != nil {
		_ = c.bw.Flush()
	}
}

// cancelStream: the client reset the stream, or the connection ended;
// what the stream holds is released as when grpc-go cancels a handler.
func (h *h2Stream) cancelStream() {
	if h.cancel != nil {
		h.cancel()
	}
	if !h.ended {
		h.ended = true
		if h.q != nil {
			h.q.end(true)
		} else if h.st != nil {
			h.st.finish()
		}
	}
	c := h.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	delete(c.parked, h.id)
	h.out = nil
	if !h.closed {
		h.closed = true
		c.streamDoneLocked()
	}
}

// statusOf is the status a handler's error ends its stream with (nil:
// OK).
func statusOf(err error) *status.Status {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus()
	}
	return status.New(codes.Unknown, err.Error())
}

// badRequest is the end of a stream whose message could not be read.
func badRequest(err error) *status.Status {
	return status.Newf(codes.Internal, "turnout Endpoint Picker: cannot read the ProcessingRequest: %v", err)
}

// SendMsg queues one answer (an *answer or a proto.Message), encoded into
// the stream's buffer, and writes what the windows let through.
func (h *h2Stream) SendMsg(m any) error {
	c := h.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if h.closed || c.broken || h.ending {
		return status.Error(codes.Canceled, "the stream ended")
	}
	if !h.headersSent {
		h.headersSent = true
		if err := c.writeBlockLocked(h.id, false, hpackHeaders); err != nil {
			c.broken = true
			return err
		}
	}
	if a, ok := m.(*answer); ok {
		if sent, err := c.writeChunkLocked(h, a); sent || err != nil {
			return c.flushStreamLocked(h, err)
		}
	}
	if h.out == nil {
		h.out, c.spareOut = takeBuf(c.spareOut)
	}
	start := len(h.out)
	h.out = append(h.out, 0, 0, 0, 0, 0) // uncompressed; the length below
	switch m := m.(type) {
	case *answer:
		h.out = m.appendTo(h.out)
	case proto.Message:
		var err error
		if h.out, err = (proto.MarshalOptions{}).MarshalAppend(h.out, m); err != nil {
			h.out = h.out[:start]
			return fmt.Errorf("epp: %w", err)
		}
	default:
		h.out = h.out[:start]
		return fmt.Errorf("epp: cannot send %T", m)
	}
	binary.BigEndian.PutUint32(h.out[start+1:], uint32(len(h.out)-start-5))
	c.writeOutLocked(h)
	return c.flushStreamLocked(h, nil)
}

// flushStreamLocked flushes what a stream on its own goroutine wrote (the
// loop flushes its streams' answers once per burst of input).
func (c *h2Conn) flushStreamLocked(h *h2Stream, err error) error {
	if err != nil || h.q == nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		c.broken = true
		return err
	}
	return nil
}

// RecvMsg decodes the stream goroutine's next message into m, a *procReq
// (flow-control streams).
func (h *h2Stream) RecvMsg(m any) error {
	if h.q == nil {
		return status.Error(codes.Internal, "turnout Endpoint Picker: Recv on an inline stream")
	}
	b, err := h.q.pop()
	if err != nil {
		return err
	}
	if err := decodeRequest(b, m.(*procReq)); err != nil {
		return badRequest(err).Err()
	}
	return nil
}

func (h *h2Stream) Context() context.Context { return h.ctx }

// msgQueue feeds a stream's goroutine the loop's messages, in order.
type msgQueue struct {
	mu       sync.Mutex
	cond     sync.Cond
	q        [][]byte
	eof      bool
	canceled bool
}

func newMsgQueue() *msgQueue {
	q := &msgQueue{}
	q.cond.L = &q.mu
	return q
}

func (q *msgQueue) push(r []byte) {
	q.mu.Lock()
	q.q = append(q.q, r)
	q.mu.Unlock()
	q.cond.Signal()
}

// end: no more messages; canceled: the stream was reset.
func (q *msgQueue) end(canceled bool) {
	q.mu.Lock()
	q.eof = true
	q.canceled = q.canceled || canceled
	q.mu.Unlock()
	q.cond.Signal()
}

func (q *msgQueue) pop() ([]byte, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.q) == 0 && !q.eof {
		q.cond.Wait()
	}
	switch {
	case q.canceled:
		return nil, status.Error(codes.Canceled, "the gateway canceled the stream")
	case len(q.q) > 0:
		r := q.q[0]
		q.q[0] = nil
		q.q = q.q[1:]
		return r, nil
	}
	return nil, io.EOF
}
