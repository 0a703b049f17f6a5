package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format of one batch (one NATS message, one pool), little-endian:
//
//	magic "TPX1"
//	u8 len, origin instance name
//	u8 len, pool name
//	u16 block bytes (the pool's prefix block size: peers configured with
//	another size hash other block boundaries, their batches are skipped)
//	records until the end: u8 len, endpoint name; uvarint n; n x u64 block hash
//
// Hand-written rather than msgpack: three fields, encoded on the publisher
// goroutine into one reused buffer without allocating, and decoded with a
// bound check on every length so a hostile or truncated message is refused
// before anything is applied.
const magic = "TPX1"

// Limits a message must respect; anything beyond is malformed.
const (
	MaxMessageBytes = 1 << 20 // NATS' default max_payload
	maxNameLen      = 255
	maxBlocks       = 1 << 16
)

var (
	errMagic     = errors.New("bad magic")
	errTruncated = errors.New("truncated")
	errTooMany   = errors.New("too many blocks in a record")
	errEmpty     = errors.New("empty name")
)

// appendHeader starts a batch.
func appendHeader(b []byte, origin, pool string, blockBytes int) []byte {
	b = append(b, magic...)
	b = append(b, byte(len(origin)))
	b = append(b, origin...)
	b = append(b, byte(len(pool)))
	b = append(b, pool...)
	return binary.LittleEndian.AppendUint16(b, uint16(blockBytes))
}

// appendRecord adds one decision.
func appendRecord(b []byte, endpoint string, blocks []uint64) []byte {
	b = append(b, byte(len(endpoint)))
	b = append(b, endpoint...)
	b = binary.AppendUvarint(b, uint64(len(blocks)))
	for _, h := range blocks {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// message is a decoded batch; names and blocks are views into the message
// or into the caller's buffer.
type header struct {
	origin, pool []byte
	blockBytes   int
	rest         []byte
}

func readName(b []byte) (name, rest []byte, err error) {
	if len(b) < 1 {
		return nil, nil, errTruncated
	}
	n := int(b[0])
	if n == 0 {
		return nil, nil, errEmpty
	}
	if len(b) < 1+n {
		return nil, nil, errTruncated
	}
	return b[1 : 1+n], b[1+n:], nil
}

func decodeHeader(b []byte) (header, error) {
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return header{}, errMagic
	}
	return decodeHeaderFields(b[len(magic):])
}

// decodeHeaderFields decodes the header after its magic (batches and load
// messages share it).
func decodeHeaderFields(b []byte) (header, error) {
	var h header
	var err error
	if h.origin, b, err = readName(b); err != nil {
		return h, fmt.Errorf("origin: %w", err)
	}
	if h.pool, b, err = readName(b); err != nil {
		return h, fmt.Errorf("pool: %w", err)
	}
	if len(b) < 2 {
		return h, fmt.Errorf("block bytes: %w", errTruncated)
	}
	h.blockBytes = int(binary.LittleEndian.Uint16(b))
	h.rest = b[2:]
	return h, nil
}

// nextRecord decodes the next record of rest into buf.
func nextRecord(rest []byte, buf []uint64) (endpoint []byte, blocks []uint64, tail []byte, err error) {
	endpoint, rest, err = readName(rest)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("endpoint: %w", err)
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 {
		return nil, nil, nil, errTruncated
	}
	rest = rest[k:]
	if n > maxBlocks {
		return nil, nil, nil, errTooMany
	}
	if uint64(len(rest)) < n*8 {
		return nil, nil, nil, errTruncated
	}
	buf = buf[:0]
	for i := uint64(0); i < n; i++ {
		buf = append(buf, binary.LittleEndian.Uint64(rest[i*8:]))
	}
	return endpoint, buf, rest[n*8:], nil
}

// validate checks a whole message before any record is applied, so a
// malformed tail never leaves half a batch applied.
func validate(b []byte) (header, int, error) {
	h, err := decodeHeader(b)
	if err != nil {
		return h, 0, err
	}
	rest := h.rest
	n := 0
	for len(rest) > 0 {
		if _, _, rest, err = skipRecord(rest); err != nil {
			return h, n, fmt.Errorf("record %d: %w", n, err)
		}
		n++
	}
	return h, n, nil
}

func skipRecord(rest []byte) (endpoint []byte, n uint64, tail []byte, err error) {
	endpoint, rest, err = readName(rest)
	if err != nil {
		return nil, 0, nil, err
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 {
		return nil, 0, nil, errTruncated
	}
	rest = rest[k:]
	if n > maxBlocks {
		return nil, 0, nil, errTooMany
	}
	if uint64(len(rest)) < n*8 {
		return nil, 0, nil, errTruncated
	}
	return endpoint, n, rest[n*8:], nil
}
