// Package kv ingests vLLM KV-cache events (ZMQ PUB, msgpack payloads) and
// keeps a bounded index of which replica holds which prompt-prefix blocks.
//
// Wire format, from vllm/distributed/kv_events.py: each ZMQ message is
// [topic, seq (8 bytes big-endian), payload]; the payload is a msgspec
// EventBatch. Two encodings exist in the field and both are accepted:
//
//   - legacy "array_like": EventBatch is [ts, events, dp_rank?] and each event
//     is a tagged array ["BlockStored", hashes, parent, tokens, ...];
//   - current (vllm-project/vllm#42892): events are tagged maps
//     {"type": "BlockStored", "block_hashes": ..., ...}; the outer batch may be
//     an array or a map {"ts", "events", "data_parallel_rank"}.
//
// Trailing positional fields may be absent (old vLLM) or extra (new vLLM);
// unknown map keys and unknown event tags are skipped.
package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// EventKind is the type of a KV-cache event.
type EventKind uint8

// Event kinds, named after vLLM's msgspec tags.
const (
	EventUnknown EventKind = iota
	EventBlockStored
	EventBlockRemoved
	EventAllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case EventBlockStored:
		return tagBlockStored
	case EventBlockRemoved:
		return tagBlockRemoved
	case EventAllBlocksCleared:
		return tagAllBlocksCleared
	}
	return "Unknown"
}

const (
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"

	// MediumGPU is what vLLM puts in Medium for device-memory blocks.
	MediumGPU = "GPU"

	specFullAttention = "full_attention"
)

// Event is one decoded KV-cache event. Engine hashes are normalized to
// uint64: an integer hash is taken as is (negative int64 as its two's
// complement), a byte-string hash as its low 64 bits big-endian, which is
// exactly the int vLLM itself publishes when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
// is on, so both publisher settings yield the same keys.
type Event struct {
	Kind        EventKind
	BlockHashes []uint64
	ParentHash  uint64
	// HasParent is false for a chain's first block: vLLM sends nil there,
	// llm-d's publishers 0; both decode to HasParent false.
	HasParent bool
	// TokenIDs is the concatenation of the stored blocks' tokens,
	// BlockSize tokens per block (see TokenID for the accepted range).
	TokenIDs  []uint32
	BlockSize int
	LoraID    int64
	HasLoraID bool
	LoraName  string // "" when absent or None
	Medium    string // "" when absent or None; vLLM sends "GPU" or e.g. "CPU" for offloaded tiers
	GroupIdx  int    // KV-cache group of hybrid models
	HasGroup  bool
	// SpecKind is the group's kv_cache_spec_kind ("full_attention",
	// "sliding_window", "mamba", ...) when vLLM sends it with stores.
	SpecKind string
	// ExtraKeys, when vLLM sent extra_keys, has one entry per block: true if
	// that block's hash also covers non-token inputs (multimodal data, LoRA,
	// cache_salt), so its token ids alone do not identify its contents.
	ExtraKeys []bool
}

// Batch is one decoded EventBatch.
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int
	HasDPRank bool
	// Skipped counts events with an unknown tag (newer vLLM), dropped
	// rather than failing the whole batch.
	Skipped int
	// Rejected counts events, by reason, that were well-formed msgpack but
	// not a usable event; each is dropped alone and the rest of the batch
	// still applies (a lost BlockRemoved would leave a phantom block).
	Rejected [NumRejectReasons]int
	// RejectErr is the first rejection's error, for logs.
	RejectErr error
}

// RejectReason classifies an event dropped from an otherwise good batch.
type RejectReason uint8

// Reasons an event is rejected; the names label turnout_kv_events_rejected_total.
const (
	RejectTokenRange   RejectReason = iota // a token id is negative or beyond uint32
	RejectMissingField                     // a required field is absent
	RejectBadField                         // a field has the wrong type or an impossible value
	RejectShape                            // not a tagged array or map
	NumRejectReasons
)

func (r RejectReason) String() string {
	switch r {
	case RejectTokenRange:
		return "token_id_range"
	case RejectMissingField:
		return "missing_field"
	case RejectBadField:
		return "bad_field"
	case RejectShape:
		return "bad_shape"
	}
	return "unknown"
}

// Sentinels that pick an event's RejectReason; anything else is a bad field.
var (
	errTokenRange   = errors.New("token id out of range")
	errMissingField = errors.New("missing field")
	errEventShape   = errors.New("bad event shape")
)

func rejectReason(err error) RejectReason {
	switch {
	case errors.Is(err, errTokenRange):
		return RejectTokenRange
	case errors.Is(err, errMissingField):
		return RejectMissingField
	case errors.Is(err, errEventShape):
		return RejectShape
	}
	return RejectBadField
}

// TokenID is the one conversion of a token id, used for KV events and for
// /tokenize answers and token-id prompts alike, so both sides hash the same
// ids: any integer in [0, 2^32-1] is accepted. Real vocabularies are far
// smaller, but some engines and tokenizers hand out ids at or above 2^31,
// which vLLM publishes as plain (msgpack uint) ints.
func TokenID(v int64) (uint32, bool) {
	if v < 0 || v > math.MaxUint32 {
		return 0, false
	}
	return uint32(v), true
}

// ErrMalformed is wrapped by every DecodeBatch error.
var ErrMalformed = errors.New("kv: malformed event batch")

// maxDepth bounds nesting when skipping unknown values so hostile input
// cannot drive deep recursion.
const maxDepth = 32

// maxShort is the longest string read as a value (keys, tags, media);
// a longer key or tag matches nothing, a longer medium or name is refused.
const maxShort = 64

// decoder reads msgpack straight from the payload: every primitive is a
// bounds-checked read at p, nothing is copied, and an event that fails is
// skipped from its start. Decoded slices point into its arenas, which a
// Decoder keeps from one payload to the next.
type decoder struct {
	b []byte
	p int

	evBuf   []Event
	hashBuf []uint64
	tokBuf  []uint32
	flagBuf []bool
}

// Decoder decodes EventBatches into storage it reuses, so a steady stream
// decodes without allocating. The Batch that Decode returns (its events and
// their slices) is valid only until the next Decode; a Decoder is not safe
// for concurrent use.
type Decoder struct{ x decoder }

// Decode decodes one payload, like DecodeBatch.
func (d *Decoder) Decode(payload []byte) (Batch, error) { return d.x.decode(payload) }

// DecodeBatch decodes a vLLM EventBatch payload into memory of its own.
// Malformed input yields an error wrapping ErrMalformed; it never panics.
func DecodeBatch(payload []byte) (Batch, error) {
	var x decoder
	return x.decode(payload)
}

func (x *decoder) decode(payload []byte) (b Batch, err error) {
	defer func() {
		// Belt and braces: every read is bounds-checked, but a panic here
		// would take down the subscriber.
		if r := recover(); r != nil {
			b, err = Batch{}, fmt.Errorf("%w: decoder panic: %v", ErrMalformed, r)
		}
	}()
	x.b, x.p = payload, 0
	x.evBuf, x.hashBuf, x.tokBuf, x.flagBuf = x.evBuf[:0], x.hashBuf[:0], x.tokBuf[:0], x.flagBuf[:0]
	b, err = x.batch()
	if err != nil {
		return Batch{}, err
	}
	if n := x.rest(); n != 0 {
		return Batch{}, x.fail("%d trailing bytes", n)
	}
	return b, nil
}

func (x *decoder) rest() int { return len(x.b) - x.p }

func (x *decoder) fail(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

func (x *decoder) peek() (byte, error) {
	if x.p >= len(x.b) {
		return 0, x.fail("truncated")
	}
	return x.b[x.p], nil
}

// be reads an n-byte big-endian unsigned integer.
func (x *decoder) be(what string, n int) (uint64, error) {
	if x.rest() < n {
		return 0, x.fail("%s: truncated", what)
	}
	var v uint64
	for _, c := range x.b[x.p : x.p+n] {
		v = v<<8 | uint64(c)
	}
	x.p += n
	return v, nil
}

// takeNil consumes a nil if it is next.
func (x *decoder) takeNil() (bool, error) {
	c, err := x.peek()
	if err != nil || c != msgpcode.Nil {
		return false, err
	}
	x.p++
	return true, nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func (x *decoder) arrayLen(what string) (int, error) { return x.containerLen(what, false) }

func (x *decoder) mapLen(what string) (int, error) { return x.containerLen(what, true) }

// containerLen reads an array or a map header; each element takes at least
// one byte (a map's entry two), so a length beyond the remaining input is
// rejected before anything is allocated for it.
func (x *decoder) containerLen(what string, isMapHeader bool) (int, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	kind, ok, per := "array", isArray(c), 1
	if isMapHeader {
		kind, ok, per = "map", isMap(c), 2
	}
	if !ok {
		return 0, x.fail("%s: want %s, got code %#x", what, kind, c)
	}
	x.p++
	var n uint64
	switch c {
	case msgpcode.Array16, msgpcode.Map16:
		n, err = x.be(what, 2)
	case msgpcode.Array32, msgpcode.Map32:
		n, err = x.be(what, 4)
	default:
		n = uint64(c & 0x0f)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(x.rest()/per) {
		return 0, x.fail("%s: %s length %d exceeds input", what, kind, n)
	}
	return int(n), nil
}

// bytesLen reads a string or bin header; the length is checked against
// the input.
func (x *decoder) bytesLen(what string) (int, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	x.p++
	var n uint64
	switch c {
	case msgpcode.Str8, msgpcode.Bin8:
		n, err = x.be(what, 1)
	case msgpcode.Str16, msgpcode.Bin16:
		n, err = x.be(what, 2)
	case msgpcode.Str32, msgpcode.Bin32:
		n, err = x.be(what, 4)
	default:
		if !msgpcode.IsFixedString(c) {
			x.p--
			return 0, x.fail("%s: want string, got code %#x", what, c)
		}
		n = uint64(c & msgpcode.FixedStrMask)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(x.rest()) {
		return 0, x.fail("%s: string length %d exceeds input", what, n)
	}
	return int(n), nil
}

// str reads a string (or bin) in place; strings longer than maxShort are
// consumed and reported as long=true.
func (x *decoder) str(what string) (s []byte, long bool, err error) {
	n, err := x.bytesLen(what)
	if err != nil {
		return nil, false, err
	}
	s = x.b[x.p : x.p+n]
	x.p += n
	return s, n > maxShort, nil
}

// optString reads str-or-nil; common values avoid an allocation.
func (x *decoder) optString(what string) (string, error) {
	if isNil, err := x.takeNil(); err != nil || isNil {
		return "", err
	}
	c, err := x.peek()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) {
		return "", x.fail("%s: want string, got code %#x", what, c)
	}
	s, long, err := x.str(what)
	if err != nil {
		return "", err
	}
	if long {
		return "", x.fail("%s: string too long", what)
	}
	switch string(s) {
	case MediumGPU:
		return MediumGPU, nil
	case "CPU":
		return "CPU", nil
	case specFullAttention:
		return specFullAttention, nil
	}
	return string(s), nil
}

// integer reads any msgpack int as its 64-bit two's complement (uint64
// above int64's range included, as its bits); signed tells whether the
// value was a signed code, for callers that care about the range.
func (x *decoder) integer(what string) (v uint64, signed bool, err error) {
	c, err := x.peek()
	if err != nil {
		return 0, false, err
	}
	if c <= msgpcode.PosFixedNumHigh {
		x.p++
		return uint64(c), false, nil
	}
	if c >= msgpcode.NegFixedNumLow {
		x.p++
		return uint64(int64(int8(c))), true, nil
	}
	var n int
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		n = 1
	case msgpcode.Uint16, msgpcode.Int16:
		n = 2
	case msgpcode.Uint32, msgpcode.Int32:
		n = 4
	case msgpcode.Uint64, msgpcode.Int64:
		n = 8
	default:
		return 0, false, x.fail("%s: want int, got code %#x", what, c)
	}
	x.p++
	if v, err = x.be(what, n); err != nil {
		return 0, false, err
	}
	switch c {
	case msgpcode.Int8:
		return uint64(int64(int8(v))), true, nil
	case msgpcode.Int16:
		return uint64(int64(int16(v))), true, nil
	case msgpcode.Int32:
		return uint64(int64(int32(v))), true, nil
	case msgpcode.Int64:
		return v, true, nil
	}
	return v, false, nil
}

func (x *decoder) int64(what string) (int64, error) {
	v, signed, err := x.integer(what)
	if err != nil {
		return 0, err
	}
	if !signed && v > math.MaxInt64 {
		return 0, x.fail("%s: %d overflows int64", what, v)
	}
	return int64(v), nil
}

func (x *decoder) optInt(what string) (int64, bool, error) {
	if isNil, err := x.takeNil(); err != nil || isNil {
		return 0, false, err
	}
	v, err := x.int64(what)
	return v, err == nil, err
}

func (x *decoder) intRange(what string, lo, hi int64) (int, error) {
	v, err := x.int64(what)
	if err != nil {
		return 0, err
	}
	if v < lo || v > hi {
		return 0, x.fail("%s: %d out of range", what, v)
	}
	return int(v), nil
}

// hash reads an engine block hash: any msgpack int (uint64 above int64 range
// and negative int64 included) or a byte string.
func (x *decoder) hash(what string) (uint64, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, x.fail("%s: nil hash", what)
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		n, err := x.bytesLen(what)
		if err != nil {
			return 0, err
		}
		if n <= 0 {
			return 0, x.fail("%s: empty hash", what)
		}
		// int.from_bytes(h, "big") & (2**64-1) == the last 8 bytes.
		var h uint64
		for _, by := range x.b[x.p+n-min(n, 8) : x.p+n] {
			h = h<<8 | uint64(by)
		}
		x.p += n
		return h, nil
	case c == msgpcode.Float || c == msgpcode.Double:
		return 0, x.fail("%s: float hash", what)
	}
	h, _, err := x.integer(what)
	return h, err
}

// arena returns a's storage for one more decoded slice: never nil, so an
// empty list stays distinct from an absent one.
func arena[T any](a []T, n int) []T {
	if a == nil {
		return make([]T, 0, max(n, 16))
	}
	return a
}

func (x *decoder) hashes(what string) ([]uint64, error) {
	n, err := x.arrayLen(what)
	if err != nil {
		return nil, err
	}
	x.hashBuf = arena(x.hashBuf, n)
	start := len(x.hashBuf)
	for range n {
		// Fast path: the unsigned int codes vLLM's int hashes use; the
		// rest (negative ints, byte strings, errors) through hash.
		if v, k := fastUint(x.b[x.p:]); k > 0 {
			x.hashBuf, x.p = append(x.hashBuf, v), x.p+k
			continue
		}
		h, err := x.hash(what)
		if err != nil {
			return nil, err
		}
		x.hashBuf = append(x.hashBuf, h)
	}
	return x.hashBuf[start:len(x.hashBuf):len(x.hashBuf)], nil
}

// tokens reads a block's token ids. Ingest spends most of its decoding
// here (16 ids per block): the unsigned int codes are read straight from
// the payload, anything else goes through token, which judges it.
func (x *decoder) tokens(what string) ([]uint32, error) {
	n, err := x.arrayLen(what)
	if err != nil {
		return nil, err
	}
	x.tokBuf = arena(x.tokBuf, n)
	start := len(x.tokBuf)
	for range n {
		if v, k := fastUint(x.b[x.p:]); k > 0 && v <= math.MaxUint32 {
			x.tokBuf, x.p = append(x.tokBuf, uint32(v)), x.p+k
			continue
		}
		t, err := x.token(what)
		if err != nil {
			return nil, err
		}
		x.tokBuf = append(x.tokBuf, t)
	}
	return x.tokBuf[start:len(x.tokBuf):len(x.tokBuf)], nil
}

// fastUint decodes a msgpack positive fixint or uint8/16/32/64 at the
// start of b, returning the bytes it took (0: another code, or too short).
func fastUint(b []byte) (uint64, int) {
	if len(b) == 0 {
		return 0, 0
	}
	switch c := b[0]; {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), 1
	case c == msgpcode.Uint8 && len(b) >= 2:
		return uint64(b[1]), 2
	case c == msgpcode.Uint16 && len(b) >= 3:
		return uint64(binary.BigEndian.Uint16(b[1:])), 3
	case c == msgpcode.Uint32 && len(b) >= 5:
		return uint64(binary.BigEndian.Uint32(b[1:])), 5
	case c == msgpcode.Uint64 && len(b) >= 9:
		return binary.BigEndian.Uint64(b[1:]), 9
	}
	return 0, 0
}

func (x *decoder) token(what string) (uint32, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, x.fail("%s: want int, got nil", what)
	}
	v, signed, err := x.integer(what)
	if err != nil {
		return 0, err
	}
	if signed && int64(v) < 0 || v > math.MaxUint32 {
		return 0, fmt.Errorf("%w: %s: %w: %d", ErrMalformed, what, errTokenRange, int64(v))
	}
	return uint32(v), nil
}

// extraKeys reads list[tuple | None] | None into per-block "has extras".
func (x *decoder) extraKeys(what string) ([]bool, error) {
	if isNil, err := x.takeNil(); err != nil || isNil {
		return nil, err
	}
	n, err := x.arrayLen(what)
	if err != nil {
		return nil, err
	}
	x.flagBuf = arena(x.flagBuf, n)
	start := len(x.flagBuf)
	for range n {
		c, err := x.peek()
		if err != nil {
			return nil, err
		}
		// None or () is "no extras".
		x.flagBuf = append(x.flagBuf, c != msgpcode.Nil && c != msgpcode.FixedArrayLow)
		if err := x.skip(0); err != nil {
			return nil, err
		}
	}
	return x.flagBuf[start:len(x.flagBuf):len(x.flagBuf)], nil
}

// skip consumes one value of any type with bounded nesting.
func (x *decoder) skip(depth int) error {
	if depth > maxDepth {
		return x.fail("nesting deeper than %d", maxDepth)
	}
	c, err := x.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := x.arrayLen("skip")
		if err != nil {
			return err
		}
		for range n {
			if err := x.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := x.mapLen("skip")
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := x.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		n, err := x.bytesLen("skip")
		if err != nil {
			return err
		}
		x.p += n
		return nil
	case msgpcode.IsExt(c):
		n, err := x.extLen()
		if err != nil {
			return err
		}
		return x.discard(n)
	}
	return x.discard(scalarSize(c))
}

// scalarSize is the encoded size of a fixed-size value by its code, 0 for
// a code msgpack does not define (0xc1).
func scalarSize(c byte) int {
	switch {
	case msgpcode.IsFixedNum(c), c == msgpcode.Nil, c == msgpcode.False, c == msgpcode.True:
		return 1
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		return 2
	case msgpcode.Uint16, msgpcode.Int16:
		return 3
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		return 5
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		return 9
	}
	return 0
}

// extLen consumes an ext header and returns the length of its body
// (including the type byte, which discard consumes with it).
func (x *decoder) extLen() (int, error) {
	c := x.b[x.p]
	x.p++
	var n uint64
	var err error
	switch c {
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		n = 1 << (c - msgpcode.FixExt1)
	case msgpcode.Ext8:
		n, err = x.be("ext", 1)
	case msgpcode.Ext16:
		n, err = x.be("ext", 2)
	default: // Ext32
		n, err = x.be("ext", 4)
	}
	if err != nil {
		return 0, err
	}
	if n >= uint64(x.rest()) {
		return 0, x.fail("ext of %d bytes exceeds input", n)
	}
	return int(n) + 1, nil
}

// discard skips n raw bytes after checking the input holds them; n == 0
// is a code that is not msgpack.
func (x *decoder) discard(n int) error {
	if n == 0 {
		return x.fail("unknown code %#x", x.b[x.p])
	}
	if n > x.rest() {
		return x.fail("value of %d bytes exceeds input", n)
	}
	x.p += n
	return nil
}

func (x *decoder) batch() (Batch, error) {
	var b Batch
	c, err := x.peek()
	if err != nil {
		return b, err
	}
	if isMap(c) {
		return x.batchMap()
	}
	n, err := x.arrayLen("batch")
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, x.fail("batch: %d fields, want at least 2", n)
	}
	if b.TS, err = x.ts(); err != nil {
		return b, err
	}
	if err := x.events(&b); err != nil {
		return b, err
	}
	if n >= 3 {
		v, ok, err := x.optInt("data_parallel_rank")
		if err != nil {
			return b, err
		}
		b.DPRank, b.HasDPRank = int(v), ok
	}
	for i := 3; i < n; i++ { // fields added by a newer vLLM
		if err := x.skip(0); err != nil {
			return b, err
		}
	}
	return b, nil
}

func (x *decoder) batchMap() (Batch, error) {
	var b Batch
	n, err := x.mapLen("batch")
	if err != nil {
		return b, err
	}
	var haveTS, haveEvents bool
	for range n {
		k, _, err := x.str("batch key")
		if err != nil {
			return b, err
		}
		switch string(k) {
		case "ts":
			b.TS, err = x.ts()
			haveTS = true
		case "events":
			err = x.events(&b)
			haveEvents = true
		case "data_parallel_rank":
			var v int64
			v, b.HasDPRank, err = x.optInt("data_parallel_rank")
			b.DPRank = int(v)
		default:
			err = x.skip(0)
		}
		if err != nil {
			return b, err
		}
	}
	if !haveTS || !haveEvents {
		return b, x.fail("batch: missing ts or events")
	}
	return b, nil
}

func (x *decoder) ts() (float64, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case msgpcode.Float:
		x.p++
		v, err := x.be("ts", 4)
		return float64(math.Float32frombits(uint32(v))), err
	case msgpcode.Double:
		x.p++
		v, err := x.be("ts", 8)
		return math.Float64frombits(v), err
	case msgpcode.Nil:
		return 0, x.fail("ts: want number, got nil")
	}
	v, err := x.int64("ts")
	return float64(v), err
}

// events decodes the events in place; when one fails, the reader goes back
// to its start and skips it whole: an event that is valid msgpack but not a
// usable event is counted in b.Rejected and skipped, and only input that is
// not msgpack at all fails the batch.
func (x *decoder) events(b *Batch) error {
	n, err := x.arrayLen("events")
	if err != nil {
		return err
	}
	x.evBuf = arena(x.evBuf, n)[:0]
	for range n {
		start := x.p
		x.evBuf = append(x.evBuf, Event{})
		ev := &x.evBuf[len(x.evBuf)-1]
		if err := x.event(ev); err != nil {
			x.evBuf = x.evBuf[:len(x.evBuf)-1]
			x.p = start
			if serr := x.skip(0); serr != nil {
				return serr
			}
			b.Rejected[rejectReason(err)]++
			if b.RejectErr == nil {
				b.RejectErr = err
			}
			continue
		}
		if ev.Kind == EventUnknown {
			x.evBuf = x.evBuf[:len(x.evBuf)-1]
			b.Skipped++
		}
	}
	b.Events = x.evBuf
	return nil
}

// Rejects is the total of b.Rejected.
func (b *Batch) Rejects() int {
	n := 0
	for _, v := range b.Rejected {
		n += v
	}
	return n
}

func (x *decoder) kind(what string) (EventKind, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	if !msgpcode.IsString(c) {
		return 0, x.fail("%s: want string tag, got code %#x", what, c)
	}
	s, _, err := x.str(what)
	if err != nil {
		return 0, err
	}
	switch string(s) {
	case tagBlockStored:
		return EventBlockStored, nil
	case tagBlockRemoved:
		return EventBlockRemoved, nil
	case tagAllBlocksCleared:
		return EventAllBlocksCleared, nil
	}
	return EventUnknown, nil
}

// Event fields, in vLLM's declaration order of BlockStored.
const (
	fieldBlockHashes = iota
	fieldParent
	fieldTokens
	fieldBlockSize
	fieldLoraID
	fieldMedium
	fieldLoraName
	fieldExtraKeys
	fieldGroupIdx
	fieldSpecKind
	fieldUnknown = -1
)

// Positional fields after the tag, in vLLM's declaration order.
var (
	storedFields  = []int{fieldBlockHashes, fieldParent, fieldTokens, fieldBlockSize, fieldLoraID, fieldMedium, fieldLoraName, fieldExtraKeys, fieldGroupIdx, fieldSpecKind}
	removedFields = []int{fieldBlockHashes, fieldMedium, fieldGroupIdx}
)

// fieldIndex is the field a map event's key k names.
func fieldIndex(k []byte) int {
	switch string(k) {
	case "block_hashes":
		return fieldBlockHashes
	case "parent_block_hash":
		return fieldParent
	case "token_ids":
		return fieldTokens
	case "block_size":
		return fieldBlockSize
	case "lora_id":
		return fieldLoraID
	case "medium":
		return fieldMedium
	case "lora_name":
		return fieldLoraName
	case "extra_keys":
		return fieldExtraKeys
	case "group_idx":
		return fieldGroupIdx
	case "kv_cache_spec_kind":
		return fieldSpecKind
	}
	return fieldUnknown
}

func (x *decoder) event(ev *Event) error {
	c, err := x.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		return x.eventMap(ev)
	}
	if !isArray(c) {
		return fmt.Errorf("%w: %w: code %#x", ErrMalformed, errEventShape, c)
	}
	n, err := x.arrayLen("event")
	if err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("%w: %w: empty array", ErrMalformed, errEventShape)
	}
	if ev.Kind, err = x.kind("event tag"); err != nil {
		return fmt.Errorf("%w: %w", errEventShape, err)
	}
	var fields []int
	required := 0
	switch ev.Kind {
	case EventBlockStored:
		fields, required = storedFields, 4
	case EventBlockRemoved:
		fields, required = removedFields, 1
	}
	if n-1 < required {
		return fmt.Errorf("%w: %w: %s: %d fields, want at least %d", ErrMalformed, errMissingField, ev.Kind, n-1, required)
	}
	for i := 1; i < n; i++ {
		f := fieldUnknown // newer, unknown trailing field
		if i-1 < len(fields) {
			f = fields[i-1]
		}
		if err := x.field(ev, f); err != nil {
			return err
		}
	}
	return nil
}

func (x *decoder) eventMap(ev *Event) error {
	n, err := x.mapLen("event")
	if err != nil {
		return err
	}
	// The tag need not come first, so decode every known field and check
	// the required ones once the kind is known.
	var seen uint8
	const (
		seenTag = 1 << iota
		seenHashes
		seenParent
		seenTokens
		seenSize
	)
	for range n {
		k, _, err := x.str("event key")
		if err != nil {
			return err
		}
		if string(k) == "type" {
			ev.Kind, err = x.kind("event tag")
			seen |= seenTag
		} else {
			f := fieldIndex(k)
			err = x.field(ev, f)
			// The first four fields are the required ones, in the order
			// of their seen bits.
			if f >= 0 && f < 4 {
				seen |= seenHashes << f
			}
		}
		if err != nil {
			return err
		}
	}
	if seen&seenTag == 0 {
		return fmt.Errorf("%w: %w: map without type", ErrMalformed, errMissingField)
	}
	// Keys are read whatever the kind; keep only what the kind defines, as
	// the positional layout does.
	switch ev.Kind {
	case EventBlockStored:
		if seen&(seenHashes|seenTokens|seenSize) != seenHashes|seenTokens|seenSize {
			return fmt.Errorf("%w: %w: BlockStored", ErrMalformed, errMissingField)
		}
	case EventBlockRemoved:
		if seen&seenHashes == 0 {
			return fmt.Errorf("%w: %w: BlockRemoved block_hashes", ErrMalformed, errMissingField)
		}
		*ev = Event{Kind: ev.Kind, BlockHashes: ev.BlockHashes, Medium: ev.Medium, GroupIdx: ev.GroupIdx, HasGroup: ev.HasGroup}
	default:
		*ev = Event{Kind: ev.Kind}
	}
	return nil
}

func (x *decoder) field(ev *Event, f int) error {
	var err error
	switch f {
	case fieldBlockHashes:
		ev.BlockHashes, err = x.hashes("block_hashes")
	case fieldParent:
		var isNil bool
		if isNil, err = x.takeNil(); err == nil && !isNil {
			ev.ParentHash, err = x.hash("parent_block_hash")
			// 0 is llm-d's "no parent" (vLLM sends nil); a real block
			// hash of 0 has odds of 2^-64.
			ev.HasParent = err == nil && ev.ParentHash != 0
		}
	case fieldTokens:
		ev.TokenIDs, err = x.tokens("token_ids")
	case fieldBlockSize:
		ev.BlockSize, err = x.intRange("block_size", 0, math.MaxInt32)
	case fieldLoraID:
		ev.LoraID, ev.HasLoraID, err = x.optInt("lora_id")
	case fieldMedium:
		ev.Medium, err = x.optString("medium")
	case fieldLoraName:
		ev.LoraName, err = x.optString("lora_name")
	case fieldExtraKeys:
		ev.ExtraKeys, err = x.extraKeys("extra_keys")
	case fieldGroupIdx:
		var v int64
		v, ev.HasGroup, err = x.optInt("group_idx")
		ev.GroupIdx = int(v)
	case fieldSpecKind:
		ev.SpecKind, err = x.optString("kv_cache_spec_kind")
	default:
		err = x.skip(0)
	}
	return err
}

// EncodeOptions selects which of vLLM's layouts EncodeBatchWith produces.
type EncodeOptions struct {
	// HashAsBytes encodes each hash as 32 bytes (like vLLM's sha256 block
	// hashes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) whose last 8 bytes
	// are the hash big-endian, so it decodes back to the same uint64.
	HashAsBytes bool
	// MapEvents encodes events as tagged maps (vLLM after #42892).
	MapEvents bool
	// MapBatch also encodes the outer EventBatch as a map.
	MapBatch bool
	// ZeroParent writes a first block's parent as 0 instead of nil, as
	// llm-d's publishers do.
	ZeroParent bool
}

// EncodeBatch encodes b in vLLM's legacy array_like layout. It is the
// inverse of DecodeBatch and is meant for mock replicas and tests.
func EncodeBatch(b Batch, hashAsBytes bool) ([]byte, error) {
	return EncodeBatchWith(b, EncodeOptions{HashAsBytes: hashAsBytes})
}

// EncodeBatchWith encodes b in the layout chosen by o, following msgspec's
// omit_defaults rules: trailing defaulted fields are left out.
func EncodeBatchWith(b Batch, o EncodeOptions) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	w := &encoder{e: e, o: o}
	n := 2
	if b.HasDPRank {
		n++
	}
	w.open(o.MapBatch, n)
	w.key(o.MapBatch, "ts")
	w.float(b.TS)
	w.key(o.MapBatch, "events")
	w.events(b.Events)
	if b.HasDPRank {
		w.key(o.MapBatch, "data_parallel_rank")
		w.int(int64(b.DPRank))
	}
	if w.err != nil {
		return nil, fmt.Errorf("kv: encode batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// encoder keeps the first error so the layout code reads linearly.
type encoder struct {
	e   *msgpack.Encoder
	o   EncodeOptions
	err error
}

func (w *encoder) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *encoder) arrayLen(n int) { w.do(w.e.EncodeArrayLen(n)) }
func (w *encoder) mapLen(n int)   { w.do(w.e.EncodeMapLen(n)) }
func (w *encoder) str(s string)   { w.do(w.e.EncodeString(s)) }
func (w *encoder) float(f float64) {
	w.do(w.e.EncodeFloat64(f))
}
func (w *encoder) int(v int64) { w.do(w.e.EncodeInt(v)) }
func (w *encoder) null()       { w.do(w.e.EncodeNil()) }

func (w *encoder) optStr(s string) {
	if s == "" {
		w.null()
		return
	}
	w.str(s)
}

func (w *encoder) hash(h uint64) {
	if !w.o.HashAsBytes {
		w.do(w.e.EncodeUint(h))
		return
	}
	var b [32]byte
	binary.BigEndian.PutUint64(b[24:], h)
	w.do(w.e.EncodeBytes(b[:]))
}

func (w *encoder) hashes(hs []uint64) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *encoder) events(evs []Event) {
	w.arrayLen(len(evs))
	for i := range evs {
		w.event(&evs[i])
	}
}

// open starts a map or an array of n fields.
func (w *encoder) open(asMap bool, n int) {
	if asMap {
		w.mapLen(n)
	} else {
		w.arrayLen(n)
	}
}

// key writes a field's key in map layout; array layout is positional.
func (w *encoder) key(asMap bool, name string) {
	if asMap {
		w.str(name)
	}
}

// field is an event field's key.
func (w *encoder) field(name string) { w.key(w.o.MapEvents, name) }

func (w *encoder) event(ev *Event) {
	// Optional trailing fields of BlockStored (defaults None), in order.
	present := [3]bool{ev.ExtraKeys != nil, ev.HasGroup, ev.SpecKind != ""}
	var n int // fields after the tag
	switch ev.Kind {
	case EventBlockStored:
		n = 7 // fields without a default are always present
		for i, p := range present {
			switch {
			case w.o.MapEvents && p:
				n++ // maps omit each defaulted field
			case !w.o.MapEvents && p:
				n = 8 + i // arrays omit only trailing defaults
			}
		}
	case EventBlockRemoved:
		n = 2
		if ev.HasGroup {
			n++
		}
	case EventAllBlocksCleared:
		n = 0
	default:
		w.do(fmt.Errorf("cannot encode event kind %d", ev.Kind))
		return
	}
	w.open(w.o.MapEvents, n+1)
	w.field("type")
	w.str(ev.Kind.String())
	switch ev.Kind {
	case EventBlockStored:
		w.field("block_hashes")
		w.hashes(ev.BlockHashes)
		w.field("parent_block_hash")
		switch {
		case ev.HasParent:
			w.hash(ev.ParentHash)
		case w.o.ZeroParent:
			w.do(w.e.EncodeUint(0))
		default:
			w.null()
		}
		w.field("token_ids")
		w.arrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			w.int(int64(t))
		}
		w.field("block_size")
		w.int(int64(ev.BlockSize))
		w.field("lora_id")
		if ev.HasLoraID {
			w.int(ev.LoraID)
		} else {
			w.null()
		}
		w.field("medium")
		w.optStr(ev.Medium)
		w.field("lora_name")
		w.optStr(ev.LoraName)
		// In arrays, a default that precedes a present field is written as None.
		written := func(i int) bool {
			if w.o.MapEvents {
				return present[i]
			}
			return n >= 8+i
		}
		if written(0) {
			w.field("extra_keys")
			w.extraKeys(ev.ExtraKeys)
		}
		if written(1) {
			w.field("group_idx")
			if ev.HasGroup {
				w.int(int64(ev.GroupIdx))
			} else {
				w.null()
			}
		}
		if written(2) {
			w.field("kv_cache_spec_kind")
			w.optStr(ev.SpecKind)
		}
	case EventBlockRemoved:
		w.field("block_hashes")
		w.hashes(ev.BlockHashes)
		w.field("medium")
		w.optStr(ev.Medium)
		if ev.HasGroup {
			w.field("group_idx")
			w.int(int64(ev.GroupIdx))
		}
	}
}

// extraKeys writes one opaque tuple per flagged block; the contents are not
// recoverable from Event and do not matter to the index.
func (w *encoder) extraKeys(ks []bool) {
	if ks == nil {
		w.null()
		return
	}
	w.arrayLen(len(ks))
	for _, k := range ks {
		if k {
			w.arrayLen(1)
			w.str("extra")
		} else {
			w.null()
		}
	}
}
