package payload

import "bytes"

// One reading of "model". Python's json module (vLLM's servers) keeps the
// last of duplicate keys and resolves escapes in keys; turnout read the
// first "model" only, so {"model":"a",...,"model":"b"} was routed to a's
// pool and served as b. The Index therefore notes a second top-level
// "model" key, escaped spellings ("mod\u0065l") included, and route
// refuses such a body (400 duplicate_model): no reader of the body can
// then disagree on its model.
//
// The pass still pauses after the first "model" for model-only decisions;
// DuplicateModel reads on only when the rest of the body may hold another
// "model" key.
// A key is a JSON string followed by ':', so the rest is swept for ':'
// (bytes.IndexByte, SIMD: a colon is rare in prompt text and there is one
// per key) and each is checked backwards for a key that may spell "model":
// ending in `model`, or in an escaped letter (`\u006?`, m o d e l are
// \u006d \u006f \u0064 \u0065 \u006c) or in 'l' with an escape
// before it. A false match (a "model" key deeper in the body, such text
// in a prompt) only costs reading the rest of the top level. Searching
// for `"model"` itself cost 5-20x more on a 4 KiB chat body: bytes.Index
// falls back from IndexByte when its first byte is frequent.

const modelKey = "model"

// maxEscapedModelKey is the longest spelling of "model": every letter \u-escaped.
const maxEscapedModelKey = 6 * len(modelKey)

// mayHoldModelKey reports whether rest may contain a "model" key.
func mayHoldModelKey(rest []byte) bool {
	for i := bytes.IndexByte(rest, ':'); i >= 0; {
		if keyMayBeModel(rest[:i]) {
			return true
		}
		j := bytes.IndexByte(rest[i+1:], ':')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// keyMayBeModel reports whether b, the bytes before a ':', may end with a
// "model" key (a superset: the full read decides).
func keyMayBeModel(b []byte) bool {
	q := len(b)
	for q > 0 && (b[q-1] == ' ' || b[q-1] == '\t' || b[q-1] == '\n' || b[q-1] == '\r') {
		q--
	}
	if q < 1+len(modelKey) || b[q-1] != '"' {
		return false
	}
	q-- // the key's closing quote
	switch b[q-1] {
	case 'l':
		return string(b[q-len(modelKey):q]) == modelKey || bytes.Contains(b[max(0, q-maxEscapedModelKey):q], []byte(`\u006`))
	case 'c', 'C':
		return q >= 6 && string(b[q-6:q-1]) == `\u006`
	}
	return false
}

// escapedModelKey reports whether a key's raw content with escapes spells
// "model".
func escapedModelKey(raw []byte) bool {
	var buf [len(modelKey)]byte
	return string(unescape(raw, buf[:0])) == modelKey
}

// DuplicateModel reports whether the body's object has more than one
// top-level "model" key (in the part read: a cut body may hide one). Asked
// after the policy read what it needs, it costs nothing when the pass is
// complete (prompt and token-id policies), else one sweep of the rest.
func (x *Index) DuplicateModel() bool {
	if x.modelSeen && !x.done && mayHoldModelKey(x.body[x.s.i:]) {
		x.complete() // a second "model" may follow: read on
	}
	return x.dupModel
}
