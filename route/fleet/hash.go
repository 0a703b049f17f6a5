package fleet

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/turnout/turnout/route/payload"
)

// MaxBlockBytes bounds the prefix block size so the hasher's buffer is fixed.
const MaxBlockBytes = 4096

// PrefixHasher turns the prompt stream into chained block hashes: block i's
// hash mixes xxhash(block bytes) with block i-1's hash, so equal hashes mean
// equal prefixes up to and including that block. Only full blocks are
// hashed, as an engine only caches full blocks. Blocks that lie whole in one
// piece of text are hashed in place (one-shot xxhash, no copy, no Digest
// state); only blocks spanning pieces go through buf.
type PrefixHasher struct {
	blockSize int
	n         int
	prev      uint64
	Total     int // prompt bytes seen
	Out       []uint64
	buf       [MaxBlockBytes]byte
}

func (h *PrefixHasher) Reset(blockSize int, out []uint64) {
	h.blockSize = blockSize
	h.n = 0
	h.prev = 0
	h.Total = 0
	h.Out = out[:0]
}

// ResetFor is Reset for r's prompt. An adapter's chain starts at its hash,
// not 0: engines key cached blocks by adapter too (vLLM puts the LoRA's
// name in every block hash's extra keys), so an adapter's blocks are never
// a base model's or another adapter's; a base model's hashes are Reset's.
func (h *PrefixHasher) ResetFor(r *Request, blockSize int, out []uint64) {
	h.Reset(blockSize, out)
	if r.Adapter {
		h.prev = r.AdapterHash
	}
}

func (h *PrefixHasher) Text(p []byte) {
	h.Total += len(p)
	// Bounded: the prefix beyond max blocks does not matter.
	if h.n > 0 { // complete the block begun by earlier pieces
		if len(h.Out) == cap(h.Out) {
			return
		}
		c := copy(h.buf[h.n:h.blockSize], p)
		h.n += c
		p = p[c:]
		if h.n < h.blockSize {
			return
		}
		h.block(h.buf[:h.n])
		h.n = 0
	}
	// Whole blocks in place, the chain kept in locals (a 4 KiB prompt is
	// ~16 blocks of one piece).
	bs, prev, out := h.blockSize, h.prev, h.Out
	for len(p) >= bs && len(out) < cap(out) {
		prev = Mix64(xxhash.Sum64(p[:bs]) ^ (prev * 0x9e3779b97f4a7c15))
		out = append(out, prev)
		p = p[bs:]
	}
	h.prev, h.Out = prev, out
	if len(p) > 0 && len(out) < cap(out) {
		h.n = copy(h.buf[:bs], p)
	}
}

// block appends the chained hash of one full block.
func (h *PrefixHasher) block(b []byte) {
	h.prev = Mix64(xxhash.Sum64(b) ^ (h.prev * 0x9e3779b97f4a7c15))
	h.Out = append(h.Out, h.prev)
}

func (h *PrefixHasher) Sep(b byte) {
	var one [1]byte
	one[0] = b
	h.Text(one[:])
}

func (h *PrefixHasher) Token(id uint32) {
	var t [4]byte
	binary.LittleEndian.PutUint32(t[:], id)
	h.Text(t[:])
}

var _ payload.PromptSink = (*PrefixHasher)(nil)

// HashKey is the session hash; pinned by tests so a change that would
// reshuffle every session fails CI.
func HashKey(b []byte) uint64 { return xxhash.Sum64(b) }

// Mix64 is splitmix64's finalizer: mixing a key hash with a per-endpoint seed
// gives rendezvous-quality scores without hashing the key again.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
