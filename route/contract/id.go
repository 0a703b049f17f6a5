package contract

import (
	"encoding/binary"
	"strconv"
)

// A decision id goes out as 16 hex digits (X-Turnout-Decision, the SPOE
// variable, the feedback line's id) and comes back the same way.

// appendID writes a decision id as 16 hex digits, 8 at a time (hex8): a
// loop over digits cost ~160 instructions per decision, an append per
// digit ~250.
func appendID(dst []byte, id uint64) []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hex8(uint32(id>>32)))
	binary.BigEndian.PutUint64(b[8:], hex8(uint32(id)))
	return append(dst, b[:]...)
}

// hex8 returns the 8 lower-case hex digits of v as the bytes of a word,
// the first digit in the top byte: each nibble is spread to a byte, then
// '0' is added, and 'a'-'0'-10 more where the nibble is >= 10 (n+6 carries
// into bit 4 exactly then; no byte overflows into the next).
func hex8(v uint32) uint64 {
	x := uint64(v)
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	x = (x | x<<4) & 0x0f0f0f0f0f0f0f0f
	letters := (x + 0x0606060606060606) >> 4 & 0x0101010101010101
	return x + 0x3030303030303030 + letters*('a'-'0'-10)
}

// ParseDecisionID reads a decision id as the proxy sends it back
// (Verdict.DecisionHex).
func ParseDecisionID(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b), 16, 64)
	return v, err == nil
}
