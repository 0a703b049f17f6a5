package bench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/spoe"
)

// The HAProxy side of SPOP (HAProxy doc/SPOE.txt), only what the transport
// benchmark sends: HAPROXY-HELLO, then one NOTIFY per decision carrying the
// route message as the rendered spoe-message does (method, uri, hdrs in
// req.hdrs_bin form, body), each answered by an ACK before the next.

const (
	spopHAProxyHello = 1
	spopNotify       = 3
	spopAgentHello   = 101
	spopAck          = 103
	spopFin          = 1
	spopString       = 8
	spopBinary       = 9
	spopUint32       = 3
	spopMaxFrame     = 16380
)

func spopBytes(dst, s []byte) []byte { return append(spoe.AppendVarint(dst, uint64(len(s))), s...) }

// spopFrame wraps payload as a length-prefixed frame.
func spopFrame(dst []byte, typ byte, stream, frame uint64, payload []byte) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, typ, 0, 0, 0, spopFin)
	dst = spoe.AppendVarint(dst, stream)
	dst = spoe.AppendVarint(dst, frame)
	dst = append(dst, payload...)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// spoeClient is one agent connection, as one HAProxy SPOE applet uses it.
type spoeClient struct {
	c     net.Conn
	br    *bufio.Reader
	out   []byte
	in    []byte
	frame uint64
}

func dialSPOE(addr string) (*spoeClient, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("spoe dial: %w", err)
	}
	s := &spoeClient{c: c, br: bufio.NewReaderSize(c, 64<<10)}
	var kv []byte
	kv = spopBytes(kv, []byte("supported-versions"))
	kv = spopBytes(append(kv, spopString), []byte("2.0"))
	kv = spopBytes(kv, []byte("max-frame-size"))
	kv = spoe.AppendVarint(append(kv, spopUint32), spopMaxFrame)
	kv = spopBytes(kv, []byte("capabilities"))
	kv = spopBytes(append(kv, spopString), []byte("pipelining"))
	kv = spopBytes(kv, []byte("engine-id"))
	kv = spopBytes(append(kv, spopString), []byte("turnout-lab-bench"))
	if typ, _, err := s.roundTrip(spopFrame(nil, spopHAProxyHello, 0, 0, kv)); err != nil || typ != spopAgentHello {
		_ = c.Close()
		return nil, fmt.Errorf("spoe hello: frame type %d: %v", typ, err)
	}
	return s, nil
}

func (s *spoeClient) Close() error { return s.c.Close() }

// roundTrip writes frame and reads the next one: its type and payload
// (the header's flags and ids skipped).
func (s *spoeClient) roundTrip(frame []byte) (byte, []byte, error) {
	_ = s.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.c.Write(frame); err != nil {
		return 0, nil, err
	}
	var lb [4]byte
	if _, err := io.ReadFull(s.br, lb[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(lb[:]))
	if n < 7 || n > 1<<20 {
		return 0, nil, fmt.Errorf("spoe: frame of %d bytes", n)
	}
	if cap(s.in) < n {
		s.in = make([]byte, n)
	}
	b := s.in[:n]
	if _, err := io.ReadFull(s.br, b); err != nil {
		return 0, nil, err
	}
	p := b[5:]
	for range 2 { // stream-id, frame-id
		for len(p) > 0 && p[0] >= 240 {
			p = p[1:]
			for len(p) > 0 && p[0] >= 128 {
				p = p[1:]
			}
		}
		if len(p) == 0 {
			return 0, nil, errors.New("spoe: short frame header")
		}
		p = p[1:]
	}
	return b[0], p, nil
}

// spoeServerVar is the ACK's set-var of the chosen server, as encoded
// (varint length + name): present in every routed answer.
var spoeServerVar = append([]byte{byte(len(contract.SPOEVarServer))}, contract.SPOEVarServer...)

// decide sends one route NOTIFY and reads its ACK (valid until the next
// call); a refusal or an empty ACK is an error.
func (s *spoeClient) decide(stream uint64, method, uri string, hdrs, body []byte) ([]byte, error) {
	s.frame++
	p := spopBytes(s.out[:0], []byte(contract.SPOEMessageRoute))
	p = append(p, 4)
	p = spopBytes(p, []byte(contract.SPOEArgMethod))
	p = spopBytes(append(p, spopString), []byte(method))
	p = spopBytes(p, []byte(contract.SPOEArgURI))
	p = spopBytes(append(p, spopString), []byte(uri))
	p = spopBytes(p, []byte(contract.SPOEArgHeaders))
	p = spopBytes(append(p, spopBinary), hdrs)
	p = spopBytes(p, []byte(contract.SPOEArgBody))
	p = spopBytes(append(p, spopBinary), body)
	n := len(p)
	p = spopFrame(p, spopNotify, stream, s.frame, p[:n])
	s.out = p
	typ, ack, err := s.roundTrip(p[n:])
	if err != nil {
		return nil, err
	}
	if typ != spopAck {
		return nil, fmt.Errorf("spoe: frame type %d, want ACK", typ)
	}
	if !bytes.Contains(ack, spoeServerVar) {
		return nil, fmt.Errorf("spoe: ACK without a server (%d bytes): %q", len(ack), ack)
	}
	return ack, nil
}

// spoeDecisionVar is the ACK's set-var of the decision id, encoded as
// spoeServerVar.
var spoeDecisionVar = append([]byte{byte(len(contract.SPOEVarDecision))}, contract.SPOEVarDecision...)

// spoeVar finds the string value of the set-var key (spoeServerVar,
// spoeDecisionVar) in an ACK's actions (nil when absent): the name, then
// the typed value (type, varint length, bytes). Values here are shorter
// than 240 bytes, so their length is one byte.
func spoeVar(ack, key []byte) []byte {
	for off := 0; ; {
		i := bytes.Index(ack[off:], key)
		if i < 0 {
			return nil
		}
		v := ack[off+i+len(key):]
		if len(v) >= 2 && (v[0] == spopString || v[0] == spopBinary) && int(v[1]) < 240 && len(v) >= 2+int(v[1]) {
			return v[2 : 2+int(v[1])]
		}
		off += i + 1
	}
}

// spoeHeaders encodes name/value pairs as req.hdrs_bin does.
func spoeHeaders(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = spopBytes(b, []byte(kv[i]))
		b = spopBytes(b, []byte(kv[i+1]))
	}
	return append(b, 0, 0)
}
