// Package payload reads an OpenAI request body once, into an Index: the
// model, the prompt (fed to the first hasher as the pass reads it, kept as
// ordered pieces for any other), token-id prompts, the top-level members
// (kv_transfer_params, stream...) and the object's bounds. Routing, the
// policies and prefill/decode read the Index, never the body again; the
// rewrites prefill/decode needs (PrefillBody, DecodeBody) are built from it
// too.
package payload

import (
	"bytes"
	"encoding/json"
)

// Span is a byte range [Start, End) of the body.
type Span struct{ Start, End int32 }

// Member is one top-level key of the body's object: Key spans the key's raw
// content (escapes kept, quotes excluded), Value its raw JSON value.
type Member struct{ Key, Value Span }

// Index is what routing reads of one request body. It holds views into the
// body, valid as long as the body is; it is meant to be reused (Build resets
// it, keeping its buffers), so a warm Index builds without allocating.
type Index struct {
	body []byte
	cut  bool
	// scans counts Builds since the last Reset: one per request, which
	// route's TestOneBodyScan holds the handler to.
	scans int

	s    scanner // the cursor while building
	done bool    // the pass reached the end of what it can read

	// object: the body is one complete JSON object with nothing after it.
	object bool
	open   int // offset of the top-level '{', -1 when there is none
	empty  bool
	// members are the top-level keys whose value was read completely, in order.
	members []Member

	modelSeen bool
	// dupModel: a second top-level "model" key (modelkey.go).
	dupModel bool
	modelRaw []byte
	model    []byte
	modelBuf [256]byte
	// lastRaw is the last top-level "model" string after the first (nil:
	// none, or not a string).
	lastRaw []byte

	// The prompt ("messages", "prompt", "input") as the hasher consumes it.
	pieces []piece
	// live, while Prompt finishes the pass, is fed each piece as it is
	// recorded (no replay of what the scan just read).
	live        PromptSink
	promptFound bool
	// promptStop is set when a prompt value did not have the expected shape:
	// the prompt ends there (later prompt keys are skipped, as a walker that
	// stops would), the rest of the object is still indexed.
	promptStop bool

	// Token ids of a completions prompt ([int...] or the first of [[int...]]).
	ids []uint32 // every token id of the prompt, in order (pieces point here)
	// The first token list is ids[toksFrom:toksTo].
	toksFrom, toksTo int
	toksTry          bool // the first "prompt" key was seen
	toksOn           bool // recording the first token list
	toksAt           int  // offset of the first prompt list's '['

	toksBad   bool
	toksRange bool // an id of the first list is outside [0, 2^32)
	toksDone  bool // the list closed
}

// maxKeep bounds the capacity a reused Index keeps between requests: a
// pathological body (100k messages) must not pin its piece list forever.
const maxKeep = 1 << 14

// Build indexes body, replacing what the Index held (its buffers are
// kept). cut records that the body is a prefix of the request's (the proxy
// or max_body cut it).
//
// The pass stops after the first "model" key: a decision that needs only
// the model (most policies) reads no further. An accessor that needs more
// (Prompt, TokenIDs, Value, Object...) resumes the same pass where it
// stopped, so no byte is read twice whatever is asked.
func (x *Index) Build(body []byte, cut bool) {
	n := x.scans
	x.reset(body, cut)
	x.scans = n + 1
	x.s = scanner{b: body}
	if x.s.peek() != '{' {
		x.finish()
		return
	}
	x.open = x.s.i
	x.s.i++
	x.empty = x.s.peek() == '}'
	x.run(true)
	x.model = unescape(x.modelRaw, x.modelBuf[:0])
}

// run reads top-level members from the cursor (the scanner's object loop,
// made resumable), until the first "model" key when untilModel is set.
func (x *Index) run(untilModel bool) {
	// The top level runs on a local cursor (registers, not loads and stores
	// through x): a model-only decision reads a few bytes and this keeps
	// them as cheap as a bare scan. The prompt walker gets x.s.
	s := x.s
loop:
	for !x.done {
		switch s.peek() {
		case '}':
			s.i++
			s.ws()
			x.object = s.i == len(x.body)
			x.finish()
			break loop
		case ',':
			s.i++
			continue
		case '"':
		default:
			x.finish()
			break loop
		}
		keyAt := s.i + 1
		key, complete, _ := s.str()
		if !complete || s.peek() != ':' {
			x.finish()
			break loop
		}
		s.i++
		s.ws()
		start := s.i
		ok := true
		name := key
		if len(key) > len(modelKey) && len(key) <= maxEscapedModelKey && bytes.IndexByte(key, '\\') >= 0 && escapedModelKey(key) {
			name = []byte(modelKey)
		}
		switch string(name) {
		case modelKey:
			x.dupModel = x.dupModel || x.modelSeen
			if !x.modelSeen && s.i < len(s.b) && s.b[s.i] == '"' {
				x.modelSeen = true
				v, complete, _ := s.str()
				if ok = complete; ok {
					x.modelRaw = v
				}
				break
			}
			x.modelSeen = true // the first "model" routes; the last is what vLLM reads (LastModel)
			x.lastRaw = nil
			if s.i < len(s.b) && s.b[s.i] == '"' {
				v, complete, _ := s.str()
				if ok = complete; ok {
					x.lastRaw = v
				}
				break
			}
			ok = s.skip()
		case "messages", "input", "prompt":
			x.s.i = s.i
			ok = x.prompt(key)
			s.i = x.s.i
			if !ok && s.i < len(x.body) {
				// A prompt of an unexpected shape (not a cut body): the
				// prompt stops here; the value is skipped so the model, the
				// PD keys and the object's bounds are still read. Only
				// malformed input pays for reading this one value twice.
				x.promptStop = true
				s.i = start
				ok = s.skip()
			}
		default:
			ok = s.skip()
		}
		if !ok {
			x.finish()
			break loop
		}
		x.members = append(x.members, Member{
			Key:   Span{int32(keyAt), int32(keyAt + len(key))},
			Value: Span{int32(start), int32(s.i)},
		})
		if untilModel && x.modelSeen {
			break
		}
	}
	x.s.i = s.i
}

// Reset zeroes the scan count: a new request starts (Build follows, and
// clears the rest).
func (x *Index) Reset() { x.scans = 0 }

// complete finishes the pass Build paused after the model.
func (x *Index) complete() {
	if !x.done {
		x.run(false)
	}
}

func (x *Index) finish() { x.done = true }

// reset clears every field but the buffers (field by field: zeroing the
// whole struct would also clear modelBuf, a cost on every decision). A new
// field must be cleared here; TestIndexReuseTable catches stale state.
func (x *Index) reset(body []byte, cut bool) {
	x.body, x.cut, x.scans = body, cut, 0
	x.s, x.done, x.live = scanner{}, false, nil
	x.object, x.open, x.empty = false, -1, false
	x.members = keep(x.members)
	x.modelSeen, x.dupModel, x.modelRaw, x.model, x.lastRaw = false, false, nil, nil, nil
	x.pieces, x.promptFound, x.promptStop = keep(x.pieces), false, false
	x.ids, x.toksFrom, x.toksTo = keep(x.ids), 0, 0
	x.toksTry, x.toksOn, x.toksAt, x.toksBad, x.toksRange, x.toksDone = false, false, 0, false, false, false
}

// keep empties a buffer for reuse, unless it grew past maxKeep.
func keep[T any](b []T) []T {
	if cap(b) > maxKeep {
		return nil
	}
	return b[:0]
}

// Scans reports how many times the Index was built since Reset (one per
// request: everything else reads the Index).
func (x *Index) Scans() int { return x.scans }

// Body is the indexed body.
func (x *Index) Body() []byte { return x.body }

// Cut reports whether the body is a prefix of the request's.
func (x *Index) Cut() bool { return x.cut }

// Object reports whether the body is one complete JSON object, nothing after.
func (x *Index) Object() bool {
	x.complete()
	return x.object
}

// Open is the offset of the top-level '{' (-1 when the body is no object):
// where kv_transfer_params goes into the decode body.
func (x *Index) Open() int { return x.open }

// Members lists the top-level members read completely, in body order.
func (x *Index) Members() []Member {
	x.complete()
	return x.members
}

// Raw returns the bytes of a span.
func (x *Index) Raw(s Span) []byte { return x.body[s.Start:s.End] }

// Value returns the raw JSON value of the first top-level key named key
// (compared raw, escapes kept), or nil.
func (x *Index) Value(key string) []byte {
	x.complete()
	for _, m := range x.members {
		if string(x.body[m.Key.Start:m.Key.End]) == key {
			return x.body[m.Value.Start:m.Value.End]
		}
	}
	return nil
}

// Has reports whether the object has a top-level key named key.
func (x *Index) Has(key string) bool { return x.Value(key) != nil }

// ModelRaw is the first top-level "model" string's raw content (escapes kept).
func (x *Index) ModelRaw() []byte { return x.modelRaw }

// Model is ModelRaw with its JSON escapes resolved (e.g. "\/" from some
// encoders); plain names are views into the body, escaped ones live in the
// Index. A name that does not unescape (or is too long) stays raw.
func (x *Index) Model() []byte { return x.model }

// LastModel is the model as Python's json module (vLLM) reads the body:
// the last top-level "model" key's string, escapes resolved into dst
// (plain names are views into the body); the first's without a second,
// nil when the last is not a string. It reads the rest of the body (as
// DuplicateModel does when another key may follow).
func (x *Index) LastModel(dst []byte) []byte {
	if !x.DuplicateModel() {
		return x.model
	}
	if x.lastRaw == nil {
		return nil
	}
	return unescape(x.lastRaw, dst[:0])
}

// unescape resolves JSON escapes; raw is returned when there are none.
// Escaped names are rare, so encoding/json's allocations are fine here.
func unescape(raw, dst []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	var s string
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	if err := json.Unmarshal(quoted, &s); err != nil || len(s) > cap(dst) {
		return raw
	}
	return append(dst, s...)
}
