package contract

import "encoding/binary"

// Header names are matched without regard to case or '-'/'_': a name is
// normalized once (NormHeader) and a raw name compared to it (HeaderIs).

// NormHeader lower-cases a header name and maps '_' to '-': the form
// session and model header names are matched in.
func NormHeader(b []byte) []byte { return normHeader(b) }

// HeaderIs compares a raw header name to a NormHeader'd one without allocating.
func HeaderIs(raw, norm []byte) bool { return headerIs(raw, norm) }

// normHeader lower-cases a header name and maps '_' to '-'.
func normHeader(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = normByte(c)
	}
	return out
}

func normByte(c byte) byte {
	switch {
	case c >= 'A' && c <= 'Z':
		return c + ('a' - 'A')
	case c == '_':
		return '-'
	}
	return c
}

// headerIs compares a raw header name to a normalized one without allocating.
// Every request compares each header it carries with several names: the
// length test is inlined at each, and names of equal length are folded 8
// bytes at a time (a byte loop was ~5% of a prefix-affinity decision's
// instructions).
func headerIs(raw, norm []byte) bool {
	return len(raw) == len(norm) && foldEqual(raw, norm)
}

// foldEqual reports whether normHeader(raw) == norm.
func foldEqual(raw, norm []byte) bool {
	n := len(raw)
	if len(norm) != n {
		return false
	}
	switch {
	case n < 8:
		for i, c := range raw {
			if normByte(c) != norm[i] {
				return false
			}
		}
		return true
	case n <= 16: // most names: two words, overlapping when n < 16
		return fold8(binary.LittleEndian.Uint64(raw)) == binary.LittleEndian.Uint64(norm) &&
			fold8(binary.LittleEndian.Uint64(raw[n-8:])) == binary.LittleEndian.Uint64(norm[n-8:])
	}
	for i := 0; i+8 <= n; i += 8 {
		if fold8(binary.LittleEndian.Uint64(raw[i:])) != binary.LittleEndian.Uint64(norm[i:]) {
			return false
		}
	}
	// The tail: the last 8 bytes (overlapping the words above).
	return fold8(binary.LittleEndian.Uint64(raw[n-8:])) == binary.LittleEndian.Uint64(norm[n-8:])
}

// fold8 applies normByte to each byte of x: 'A'-'Z' gain 0x20 and '_'
// becomes '-', found with SWAR masks (no byte carries into the next:
// every sum below stays under 0x100 per byte); bytes >= 0x80 are left alone.
func fold8(x uint64) uint64 {
	const lo7, hi = 0x7f7f7f7f7f7f7f7f, 0x8080808080808080
	const each = 0x0101010101010101
	l := x & lo7
	// High bit set where the byte is >= 'A' and not > 'Z' (and ASCII).
	upper := (l + each*(0x80-'A')) &^ (l + each*(0x80-'Z'-1)) &^ x & hi
	// High bit set where the byte is '_' (u is 0 there).
	u := x ^ each*'_'
	under := ^((u&lo7 + lo7) | u) & hi
	return x + upper>>2 - (under>>7)*('_'-'-')
}
