package route

import "encoding/binary"

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

// hdrRole is what a forwarded header name is to decideInput: bits, as a
// name may be listed as both a session and a model header.
type hdrRole uint8

const (
	hdrForwarded hdrRole = 1 << iota // one of ForwardedHeaders (the role is known)
	hdrSession                       // one of session_headers
	hdrModel                         // one of model_headers
)

// headerRole matches a raw header name with the session and model headers.
func (s *Snapshot) headerRole(name []byte) hdrRole {
	var role hdrRole
	for _, h := range s.sessionHdrs {
		if headerIs(name, h) {
			role |= hdrSession
		}
	}
	for _, h := range s.modelHdrs {
		if headerIs(name, h) {
			role |= hdrModel
		}
	}
	return role
}

const (
	kindOther      hdrKind = iota // not read
	kindTruncated                 // X-Body-Truncated
	kindOrigURI                   // X-Original-URI
	kindOrigMethod                // X-Original-Method
	kindForwarded                 // one of ForwardedHeaders (with its role)
)

// hdrKind is what the HTTP transport makes of a request header name.
type hdrKind uint8

// nameMemo remembers what the header names of recent requests are. A proxy
// sends the same few names, spelled the same way, on every call, so the
// names are matched once per scratch and snapshot instead of on every
// request (matching was ~15% of a round-robin decision's instructions). It
// lives in the per-request scratch: no sharing, no locks. Names of 1 to 16
// bytes are keyed by their exact bytes (two overlapping words and the
// length); longer names are matched every time.
type nameMemo struct {
	gen uint64 // the Snapshot.gen the entries were matched against
	e   [16]nameMemoEntry
}

type nameMemoEntry struct {
	w0, w1 uint64
	n      uint8 // 0: empty
	kind   hdrKind
	role   hdrRole
}

// classify returns what name is under snap, from the memo when it can.
func (m *nameMemo) classify(snap *Snapshot, name []byte) (hdrKind, hdrRole) {
	n := len(name)
	if n == 0 || n > 16 {
		return snap.classify(name)
	}
	if m.gen != snap.gen {
		*m = nameMemo{gen: snap.gen}
	}
	var w0, w1 uint64
	if n >= 8 {
		w0, w1 = binary.LittleEndian.Uint64(name), binary.LittleEndian.Uint64(name[n-8:])
	} else {
		for i, c := range name {
			w0 |= uint64(c) << (8 * i)
		}
	}
	e := &m.e[(w0*0x9e3779b97f4a7c15^w1^uint64(n))>>60]
	if int(e.n) == n && e.w0 == w0 && e.w1 == w1 {
		return e.kind, e.role
	}
	kind, role := snap.classify(name)
	*e = nameMemoEntry{w0: w0, w1: w1, n: uint8(n), kind: kind, role: role}
	return kind, role
}

// classify matches a raw header name with the names the HTTP transport
// reads.
func (s *Snapshot) classify(name []byte) (hdrKind, hdrRole) {
	switch {
	case headerIs(name, truncNorm):
		return kindTruncated, 0
	case headerIs(name, origURINorm):
		return kindOrigURI, 0
	case headerIs(name, origMethodNorm):
		return kindOrigMethod, 0
	}
	if role := s.forwardedRole(name); role != 0 {
		return kindForwarded, role
	}
	return kindOther, 0
}

// The proxy call's own headers, normalized (classify matches them).
var (
	truncNorm      = normHeader([]byte(HdrBodyTruncated))
	origURINorm    = normHeader([]byte(HdrOriginalURI))
	origMethodNorm = normHeader([]byte(HdrOriginalMethod))
)
