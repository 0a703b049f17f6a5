package epp

import (
	"bytes"

	"github.com/turnout/turnout/route/contract"
)

// What the gateway sends in metadata_context (filter_metadata): the
// subset hint of the request phase and the served endpoint of the
// response phase (decode.go reads them off the wire).

// subsetHint reads the subset hint into sub: false when the gateway sent
// none (every endpoint may be picked). A hint that is present but empty,
// or lists nothing turnout routes to, is a hint all the same: the
// decision refuses it with 503, as the protocol requires.
func subsetHint(req *procReq, sub *contract.Subset) bool {
	if !req.hasSubset {
		return false
	}
	sub.Addrs = sub.Addrs[:0]
	for _, a := range req.subset {
		if a = bytes.TrimSpace(a); len(a) > 0 {
			sub.Addrs = append(sub.Addrs, a)
		}
	}
	return true
}

// servedAddr is the endpoint the gateway reports as having served (empty
// when not reported). After retries the gateway may list several; the
// last one answered.
func servedAddr(req *procReq) []byte {
	s := req.served
	if i := bytes.LastIndexByte(s, ','); i >= 0 {
		s = s[i+1:]
	}
	return bytes.TrimSpace(s)
}
