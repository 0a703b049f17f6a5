package route

import "bytes"

// What the request log says of the request itself and of how its stream
// ended: kept in fixed room, so the ledger's slot (decisions.go) holds
// them without allocating and the record copies words.

// Room for a request's identity; longer values are cut (a path's query is
// never kept: it may carry credentials).
const (
	identMethodLen = 8
	identPathLen   = 64
	identIDLen     = 64
)

// RequestIdent is a request's method, path and request id
// (contract.FwdRequestID: the client's, or the one the proxy made).
type RequestIdent struct {
	method     [identMethodLen]byte
	path       [identPathLen]byte
	id         [identIDLen]byte
	ml, pl, il uint8
}

// Set copies method, the path of uri (without its query) and id, each cut
// to its room.
func (r *RequestIdent) Set(method, uri, id []byte) {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	r.ml = uint8(copy(r.method[:], method))
	r.pl = uint8(copy(r.path[:], uri))
	r.il = uint8(copy(r.id[:], id))
}

// Method, Path and RequestID are views into r ("" when the proxy did not say).
func (r *RequestIdent) Method() []byte    { return r.method[:r.ml] }
func (r *RequestIdent) Path() []byte      { return r.path[:r.pl] }
func (r *RequestIdent) RequestID() []byte { return r.id[:r.il] }

// TermState is the feedback line's termination state
// (contract.FeedbackFieldTerm): two characters, zero when not sent.
type TermState [2]byte

// ParseTermState reads a feedback line's term value (zero when empty).
func ParseTermState(b []byte) TermState {
	var t TermState
	copy(t[:], b)
	return t
}

// known reports whether the proxy sent a state.
func (t *TermState) known() bool { return t[0] != 0 }

// bytes is the state as sent (one or two characters).
func (t *TermState) bytes() []byte {
	if t[1] == 0 {
		return t[:1]
	}
	return t[:]
}
