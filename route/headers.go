package route

import (
	"encoding/binary"

	"github.com/turnout/turnout/route/contract"
)

// hdrRole is what a forwarded header name is to decideInput: bits, as a
// name may be listed as both a session and a model header.
type hdrRole uint8

const (
	hdrForwarded hdrRole = 1 << iota // one of ForwardedHeaders (the role is known)
	hdrSession                       // one of session_headers
	hdrModel                         // one of model_headers
	hdrPriority                      // flow control's trusted priority header
	hdrTenant                        // flow control's trusted tenant header
	hdrAuthz                         // Authorization, read by flow control's tenant_keys
	hdrRequestID                     // contract.FwdRequestID
	hdrSLO                           // flow control's trusted TTFT objective header
)

// headerRole matches a raw header name with the session, model and flow
// headers.
func (s *Snapshot) headerRole(name []byte) hdrRole {
	var role hdrRole
	for _, h := range s.sessionHdrs {
		if contract.HeaderIs(name, h) {
			role |= hdrSession
		}
	}
	for _, h := range s.modelHdrs {
		if contract.HeaderIs(name, h) {
			role |= hdrModel
		}
	}
	switch {
	case s.flowPrio != nil && contract.HeaderIs(name, s.flowPrio):
		role |= hdrPriority
	case s.flowTenant != nil && contract.HeaderIs(name, s.flowTenant):
		role |= hdrTenant
	case s.flowAuthz != nil && contract.HeaderIs(name, s.flowAuthz):
		role |= hdrAuthz
	case s.flowSLO != nil && contract.HeaderIs(name, s.flowSLO):
		role |= hdrSLO
	}
	if contract.HeaderIs(name, requestIDNorm) {
		role |= hdrRequestID
	}
	return role
}

const (
	kindOther      hdrKind = iota // not read
	kindTruncated                 // X-Body-Truncated
	kindOrigURI                   // X-Original-URI
	kindOrigMethod                // X-Original-Method
	kindForwarded                 // one of ForwardedHeaders (with its role)
	kindRepeat                    // X-Turnout-Repeat
	kindWant                      // X-Turnout-Want
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
	case contract.HeaderIs(name, truncNorm):
		return kindTruncated, 0
	case contract.HeaderIs(name, origURINorm):
		return kindOrigURI, 0
	case contract.HeaderIs(name, origMethodNorm):
		return kindOrigMethod, 0
	case contract.HeaderIs(name, repeatNorm):
		return kindRepeat, 0
	case contract.HeaderIs(name, wantNorm):
		return kindWant, 0
	}
	if role := s.forwardedRole(name); role != 0 {
		return kindForwarded, role
	}
	return kindOther, 0
}

// The proxy call's own headers, normalized (classify matches them).
var (
	truncNorm      = contract.NormHeader([]byte(contract.HdrBodyTruncated))
	origURINorm    = contract.NormHeader([]byte(contract.HdrOriginalURI))
	origMethodNorm = contract.NormHeader([]byte(contract.HdrOriginalMethod))
	repeatNorm     = contract.NormHeader([]byte(contract.HdrRepeat))
	wantNorm       = contract.NormHeader([]byte(contract.HdrWant))
	requestIDNorm  = contract.NormHeader([]byte(contract.FwdRequestID))
)
