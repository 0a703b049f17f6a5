package spoe

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// SPOP wire format (HAProxy doc/SPOE.txt, section 3), only what an agent
// needs: decoding HAPROXY-HELLO / NOTIFY / HAPROXY-DISCONNECT and encoding
// AGENT-HELLO / ACK / AGENT-DISCONNECT. Decoding returns views into the frame
// and encoding appends to a caller-owned slice, so neither allocates.

// Frame types.
const (
	frameUnset             byte = 0 // continuation fragment
	frameHAProxyHello      byte = 1
	frameHAProxyDisconnect byte = 2
	frameNotify            byte = 3
	frameAgentHello        byte = 101
	frameAgentDisconnect   byte = 102
	frameAck               byte = 103
)

// Frame flags.
const (
	flagFin   uint32 = 1
	flagAbort uint32 = 2
)

// Typed data (low nibble of the type byte; the high nibble holds flags).
const (
	typeNull   byte = 0
	typeBool   byte = 1
	typeInt32  byte = 2
	typeUint32 byte = 3
	typeInt64  byte = 4
	typeUint64 byte = 5
	typeIPv4   byte = 6
	typeIPv6   byte = 7
	typeString byte = 8
	typeBinary byte = 9

	typeMask byte = 0x0f
	flagTrue byte = 0x10
)

// Variable scopes of a set-var action.
const (
	scopeProc byte = 0
	scopeSess byte = 1
	scopeTxn  byte = 2
	scopeReq  byte = 3
	scopeRes  byte = 4
)

const actionSetVar byte = 1

// SPOP status codes (AGENT-DISCONNECT "status-code").
const (
	statusNormal       uint32 = 0
	statusIO           uint32 = 1
	statusTimeout      uint32 = 2
	statusTooBig       uint32 = 3
	statusInvalid      uint32 = 4
	statusNoVersion    uint32 = 5
	statusNoFrameSize  uint32 = 6
	statusNoCaps       uint32 = 7
	statusBadVersion   uint32 = 8
	statusBadFrameSize uint32 = 9
	statusFragNotSupp  uint32 = 10
	statusInterlaced   uint32 = 11
	statusUnknown      uint32 = 99
)

// minFrameSize is the smallest max-frame-size SPOP allows.
const minFrameSize = 256

var (
	errShort    = errors.New("spop: truncated data")
	errVarint   = errors.New("spop: bad varint")
	errDataType = errors.New("spop: unknown data type")
)

// AppendVarint encodes v with the "peers" varint encoding SPOP uses (the
// lab's SPOE client writes its frames with it too).
func AppendVarint(dst []byte, v uint64) []byte {
	if v < 240 {
		return append(dst, byte(v))
	}
	dst = append(dst, byte(v)|240)
	v = (v - 240) >> 4
	for v >= 128 {
		dst = append(dst, byte(v)|128)
		v = (v - 128) >> 7
	}
	return append(dst, byte(v))
}

// readVarint decodes a varint at the start of b and returns it with the
// number of bytes it took.
func readVarint(b []byte) (uint64, int, error) {
	if len(b) == 0 {
		return 0, 0, errShort
	}
	v := uint64(b[0])
	if v < 240 {
		return v, 1, nil
	}
	shift := uint(4)
	for i := 1; i < len(b); i++ {
		if shift > 63 {
			return 0, 0, errVarint
		}
		v += uint64(b[i]) << shift
		if b[i] < 128 {
			return v, i + 1, nil
		}
		shift += 7
	}
	return 0, 0, errShort
}

// readBytes reads a length-prefixed byte string (names in KV lists,
// messages and actions have no type byte).
func readBytes(b []byte) ([]byte, int, error) {
	n, k, err := readVarint(b)
	if err != nil {
		return nil, 0, err
	}
	if n > uint64(len(b)-k) {
		return nil, 0, errShort
	}
	return b[k : k+int(n)], k + int(n), nil
}

func appendBytes(dst, s []byte) []byte {
	return append(AppendVarint(dst, uint64(len(s))), s...)
}

func appendString(dst []byte, s string) []byte {
	return append(AppendVarint(dst, uint64(len(s))), s...)
}

// value is one decoded typed datum; Bytes views the frame for strings,
// binaries and addresses.
type value struct {
	Type  byte
	Bool  bool
	Int   int64
	Uint  uint64
	Bytes []byte
}

// readValue decodes one TYPED-DATA.
func readValue(b []byte) (value, int, error) {
	if len(b) == 0 {
		return value{}, 0, errShort
	}
	v := value{Type: b[0] & typeMask}
	switch v.Type {
	case typeNull:
		return v, 1, nil
	case typeBool:
		v.Bool = b[0]&flagTrue != 0
		return v, 1, nil
	case typeInt32, typeInt64, typeUint32, typeUint64:
		u, k, err := readVarint(b[1:])
		if err != nil {
			return v, 0, err
		}
		if v.Type == typeInt32 || v.Type == typeInt64 {
			v.Int = int64(u)
		} else {
			v.Uint = u
		}
		return v, 1 + k, nil
	case typeIPv4, typeIPv6:
		n := 4
		if v.Type == typeIPv6 {
			n = 16
		}
		if len(b) < 1+n {
			return v, 0, errShort
		}
		v.Bytes = b[1 : 1+n]
		return v, 1 + n, nil
	case typeString, typeBinary:
		s, k, err := readBytes(b[1:])
		if err != nil {
			return v, 0, err
		}
		v.Bytes = s
		return v, 1 + k, nil
	}
	return v, 0, errDataType
}

func appendStringValue(dst, s []byte) []byte {
	return appendBytes(append(dst, typeString), s)
}

func appendUint32Value(dst []byte, u uint32) []byte {
	return AppendVarint(append(dst, typeUint32), uint64(u))
}

func appendInt32Value(dst []byte, i int32) []byte {
	// SPOP varints carry the two's complement bits; statuses are positive.
	return AppendVarint(append(dst, typeInt32), uint64(uint32(i)))
}

// header is a decoded frame header; payload follows it.
type header struct {
	Type     byte
	Flags    uint32
	StreamID uint64
	FrameID  uint64
}

// readHeader decodes <TYPE:1><FLAGS:4><STREAM-ID><FRAME-ID> and returns the
// payload.
func readHeader(frame []byte) (header, []byte, error) {
	var h header
	if len(frame) < 5 {
		return h, nil, errShort
	}
	h.Type = frame[0]
	h.Flags = binary.BigEndian.Uint32(frame[1:5])
	b := frame[5:]
	var k int
	var err error
	if h.StreamID, k, err = readVarint(b); err != nil {
		return h, nil, err
	}
	b = b[k:]
	if h.FrameID, k, err = readVarint(b); err != nil {
		return h, nil, err
	}
	return h, b[k:], nil
}

// beginFrame starts a frame in dst: a 4-byte length placeholder and the
// header. endFrame fills the length in.
func beginFrame(dst []byte, typ byte, flags uint32, streamID, frameID uint64) []byte {
	dst = append(dst, 0, 0, 0, 0, typ)
	dst = binary.BigEndian.AppendUint32(dst, flags)
	dst = AppendVarint(dst, streamID)
	return AppendVarint(dst, frameID)
}

func endFrame(frame []byte) []byte {
	binary.BigEndian.PutUint32(frame[:4], uint32(len(frame)-4))
	return frame
}

// kvIter walks a KV-LIST.
type kvIter struct {
	b   []byte
	err error
	// Name and Value are the current entry.
	Name  []byte
	Value value
}

func (it *kvIter) next() bool {
	if it.err != nil || len(it.b) == 0 {
		return false
	}
	name, k, err := readBytes(it.b)
	if err != nil {
		it.err = err
		return false
	}
	v, n, err := readValue(it.b[k:])
	if err != nil {
		it.err = fmt.Errorf("kv %q: %w", name, err)
		return false
	}
	it.Name, it.Value, it.b = name, v, it.b[k+n:]
	return true
}

// message is one NOTIFY message; Args iterates its arguments.
type message struct {
	Name []byte
	args []byte
	n    int
}

// arg is one message argument.
type arg struct {
	Name  []byte
	Value value
}

// msgIter walks a LIST-OF-MESSAGES. Each message's arguments must be
// consumed with argsOf before moving on (the list has no per-message length).
type msgIter struct {
	b   []byte
	err error
}

// next decodes the next message and its arguments into args (reused).
func (it *msgIter) next(args []arg) (name []byte, out []arg, ok bool) {
	if it.err != nil || len(it.b) == 0 {
		return nil, args, false
	}
	name, k, err := readBytes(it.b)
	if err != nil {
		it.err = err
		return nil, args, false
	}
	b := it.b[k:]
	if len(b) == 0 {
		it.err = errShort
		return nil, args, false
	}
	nargs := int(b[0])
	b = b[1:]
	out = args[:0]
	for range nargs {
		an, k, err := readBytes(b)
		if err != nil {
			it.err = err
			return nil, args, false
		}
		v, n, err := readValue(b[k:])
		if err != nil {
			it.err = fmt.Errorf("message %q arg %q: %w", name, an, err)
			return nil, args, false
		}
		out = append(out, arg{Name: an, Value: v})
		b = b[k+n:]
	}
	it.b = b
	return name, out, true
}

// appendSetVar appends a set-var action with a string value.
func appendSetVar(dst []byte, scope byte, name string, val []byte) []byte {
	dst = append(dst, actionSetVar, 3, scope)
	dst = appendString(dst, name)
	return appendStringValue(dst, val)
}

// appendSetVarInt appends a set-var action with an integer value.
func appendSetVarInt(dst []byte, scope byte, name string, val int32) []byte {
	dst = append(dst, actionSetVar, 3, scope)
	dst = appendString(dst, name)
	return appendInt32Value(dst, val)
}

// setVarLen is the encoded size of a set-var with a string value.
func setVarLen(name string, val int) int {
	return 3 + varintLen(uint64(len(name))) + len(name) + 1 + varintLen(uint64(val)) + val
}

func varintLen(v uint64) int {
	if v < 240 {
		return 1
	}
	n := 2
	v = (v - 240) >> 4
	for v >= 128 {
		v = (v - 128) >> 7
		n++
	}
	return n
}

// appendAgentHello encodes the AGENT-HELLO frame.
func appendAgentHello(dst []byte, version string, maxFrame uint32, caps string) []byte {
	dst = beginFrame(dst, frameAgentHello, flagFin, 0, 0)
	dst = appendString(dst, "version")
	dst = appendStringValue(dst, []byte(version))
	dst = appendString(dst, "max-frame-size")
	dst = appendUint32Value(dst, maxFrame)
	dst = appendString(dst, "capabilities")
	dst = appendStringValue(dst, []byte(caps))
	return endFrame(dst)
}

// appendAgentDisconnect encodes an AGENT-DISCONNECT frame.
func appendAgentDisconnect(dst []byte, status uint32, msg string) []byte {
	dst = beginFrame(dst, frameAgentDisconnect, flagFin, 0, 0)
	dst = appendString(dst, "status-code")
	dst = appendUint32Value(dst, status)
	dst = appendString(dst, "message")
	dst = appendStringValue(dst, []byte(msg))
	return endFrame(dst)
}
