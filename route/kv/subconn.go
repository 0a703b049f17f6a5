package kv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// subConn is one SUB connection to a publisher, read on the subscriber's
// goroutine through a buffer. zmq4's SUB socket reads every frame's header
// and body with a read call of their own and hands each message over from
// a reader goroutine through a channel; at hundreds of publishers that
// cost more CPU than decoding and indexing the events. The ZMTP handshake
// and framing stay zmq4's (Open, RecvMsg, which also answers PINGs).
type subConn struct {
	raw  net.Conn
	zc   *zmq4.Conn
	stop func() bool
}

// subReadBuffer holds a few typical batches (16 events of 4 blocks are
// ~3 KiB): most messages take one read call.
const subReadBuffer = 8 << 10

// bufferedConn reads through a bufio.Reader and writes straight through.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

var _ net.Conn = (*bufferedConn)(nil)

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// zmqNetwork maps a tcp:// or ipc:// endpoint to what net.Dial takes.
func zmqNetwork(addr string) (network, address string, err error) {
	switch {
	case strings.HasPrefix(addr, "tcp://"):
		return "tcp", addr[len("tcp://"):], nil
	case strings.HasPrefix(addr, "ipc://"):
		return "unix", addr[len("ipc://"):], nil
	}
	return "", "", fmt.Errorf("%q: want tcp:// or ipc://", addr)
}

// dialSub connects to addr, runs the ZMTP handshake as a SUB and
// subscribes to topic, all within timeout; the connection closes when ctx
// ends.
func dialSub(ctx context.Context, addr, topic string, timeout time.Duration) (*subConn, error) {
	network, address, err := zmqNetwork(addr)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: timeout}
	raw, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	// A peer that accepts the connection but never speaks ZMTP must not
	// hang the handshake.
	_ = raw.SetDeadline(time.Now().Add(timeout))
	zc, err := zmq4.Open(&bufferedConn{Conn: raw, r: bufio.NewReaderSize(raw, subReadBuffer)}, null.Security(), zmq4.Sub, nil, false, nil)
	if err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	// A ZMTP 3.0 subscription is a message: 1, then the topic prefix.
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, topic...))); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	_ = raw.SetDeadline(time.Time{})
	return &subConn{raw: raw, zc: zc, stop: context.AfterFunc(ctx, func() { _ = raw.Close() })}, nil
}

// recv returns the next message's frames, skipping ZMTP commands.
func (c *subConn) recv() ([][]byte, error) {
	for {
		msg, err := c.zc.RecvMsg()
		if err != nil {
			return nil, err
		}
		if msg.Type != zmq4.CmdMsg {
			return msg.Frames, nil
		}
	}
}

func (c *subConn) close() {
	c.stop()
	_ = c.raw.Close()
}
