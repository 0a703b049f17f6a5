package payload

import "math"

// PromptSink receives a request's prompt in order (the prefix hasher).
type PromptSink interface {
	Text(p []byte) // a piece of text (raw JSON string content, escapes kept)
	Sep(b byte)    // a structural boundary (role change, message end)
	// Token is a token id as engines hash it: its low 32 bits (TokenIDs
	// refuses a prompt with an id out of that range).
	Token(id uint32)
}

// Separator bytes fed to the sink so "ab"+"c" and "a"+"bc" differ and roles count.
const (
	SepMessage = 0x1e // record separator: end of a message
	SepRole    = 0x1f // unit separator: between role and content
	SepPart    = 0x1d // between prompts of a batch
)

type pieceKind uint8

const (
	pieceText pieceKind = iota
	pieceSep
	pieceTokens
)

// piece is one step of the prompt stream: a text span of the body, a
// separator (the byte in off) or a run of token ids (ids[off:end]: a
// 1k-token prompt is one piece, not 1k). 12 bytes: a chat body records a
// handful per message.
type piece struct {
	off, end int32
	kind     pieceKind
}

// Prompt gives the prompt to sink -- chat "messages", completions
// "prompt", Responses "input", in body order -- without reading the body
// again. It reports whether a prompt field was found.
//
// The pieces the pass recorded so far are replayed; when the pass has not
// finished (Build pauses after "model", which clients send first), sink is
// fed the rest as the pass reads it, so the usual decision hashes straight
// from the scan. The pieces are recorded either way, for a second caller
// (prefill/decode hashes for two pools).
func (x *Index) Prompt(sink PromptSink) bool {
	x.replay(sink, x.pieces)
	if !x.done {
		x.live = sink
		x.run(false)
		x.live = nil
	}
	return x.promptFound
}

func (x *Index) replay(sink PromptSink, pieces []piece) {
	for _, p := range pieces {
		switch p.kind {
		case pieceText:
			sink.Text(x.body[p.off:p.end])
		case pieceSep:
			sink.Sep(byte(p.off))
		default:
			for _, id := range x.ids[p.off:p.end] {
				sink.Token(id)
			}
		}
	}
}

// TokenIDs returns a completions prompt given as token ids ([int...] or the
// first list of [[int...]...]); ok is false for any other prompt, one cut
// before its list closed, or one with an element that is no integer in
// [0, 2^32) (the range of kv.TokenID: such ids would hash apart from KV
// events). ids is a view into the Index.
func (x *Index) TokenIDs() (ids []uint32, ok bool) {
	x.complete()
	return x.ids[x.toksFrom:x.toksTo], x.toksDone && !x.toksBad && !x.toksRange && x.toksTo > x.toksFrom
}

// The walker below reads the prompt while Build passes over it. It is
// written out per shape (not generic) so the hot path makes no closures
// that escape.

// prompt reads the value of a "messages", "input" or "prompt" key.
func (x *Index) prompt(key []byte) bool {
	if x.promptStop {
		return x.s.skip()
	}
	x.promptFound = true
	if string(key) == "prompt" {
		return x.completion()
	}
	if x.s.peek() == '"' { // Responses input as a plain string
		return x.text()
	}
	return x.s.array(x.message)
}

func (x *Index) text() bool {
	if x.s.peek() != '"' {
		return false
	}
	off := x.s.i + 1
	v, complete, ok := x.s.str()
	if !ok {
		return false
	}
	if len(v) > 0 {
		x.pieces = append(x.pieces, piece{off: int32(off), end: int32(off + len(v)), kind: pieceText})
		if x.live != nil {
			x.live.Text(v)
		}
	}
	return complete
}

func (x *Index) sep(b byte) {
	x.pieces = append(x.pieces, piece{off: int32(b), kind: pieceSep})
	if x.live != nil {
		x.live.Sep(b)
	}
}

// message handles one chat message or Responses input item.
func (x *Index) message() bool {
	if x.s.peek() == '"' { // Responses input may list plain strings
		if !x.text() {
			return false
		}
		x.sep(SepMessage)
		return true
	}
	ok := x.s.object(x.messageKey)
	x.sep(SepMessage)
	return ok
}

func (x *Index) messageKey(key []byte) bool {
	switch string(key) {
	case "role":
		if !x.text() {
			return false
		}
		x.sep(SepRole)
		return true
	case "content":
		switch x.s.peek() {
		case '"':
			return x.text()
		case '[':
			return x.s.array(x.part)
		}
	}
	return x.s.skip()
}

// part handles one content part; only text parts count (images are skipped).
func (x *Index) part() bool {
	if x.s.peek() == '"' {
		return x.text()
	}
	return x.s.object(x.partKey)
}

func (x *Index) partKey(key []byte) bool {
	// "text" carries text for type text/input_text/output_text; image parts
	// have no "text" key, so their payload is skipped with everything else.
	if string(key) == "text" && x.s.peek() == '"' {
		return x.text()
	}
	return x.s.skip()
}

// completion handles completions: string, [string], [int], [[int]]. The
// first "prompt" key's token list is recorded for TokenIDs on the way.
func (x *Index) completion() bool {
	first := !x.toksTry
	x.toksTry = true
	switch x.s.peek() {
	case '"':
		return x.text()
	case '[':
		if first {
			x.toksOn, x.toksAt = true, x.s.i
			x.toksFrom, x.toksTo = len(x.ids), len(x.ids)
		}
		ok := x.s.array(x.promptElem)
		if x.toksOn { // a flat list of ids
			x.toksDone, x.toksOn = ok, false
		}
		return ok
	}
	return x.s.skip()
}

// noTokens ends token-id recording: the prompt is not a token-id list.
func (x *Index) noTokens() {
	if x.toksOn {
		x.toksBad, x.toksOn = true, false
	}
}

func (x *Index) promptElem() bool {
	switch c := x.s.peek(); {
	case c == '"':
		x.noTokens()
		if !x.text() {
			return false
		}
		x.sep(SepPart)
		return true
	case c == '[':
		// [[int...]...]: the inner list must open the outer one ("[,[" is no
		// token prompt, however leniently the walker reads it).
		nested := x.toksOn && !x.toksBad && x.toksTo == x.toksFrom && onlyWS(x.body[x.toksAt+1:x.s.i])
		if !nested {
			x.noTokens()
		}
		ok := x.s.array(x.tokenRun)
		if nested && x.toksOn { // the first list of [[int...]...]
			x.toksDone, x.toksOn = ok, false
		}
		x.sep(SepPart)
		return ok
	case c == '-' || (c >= '0' && c <= '9'):
		return x.tokenRun()
	}
	x.noTokens()
	return x.s.skip()
}

// tokenRun reads a run of integer elements and the commas between them,
// stopping before anything else (the array loop handles it): the same
// result as one call per element, without a call per token.
func (x *Index) tokenRun() bool {
	start := len(x.ids)
	for {
		v, ok := x.s.int()
		if !ok {
			x.addTokens(start)
			x.noTokens()
			return x.s.skip()
		}
		if x.toksOn && uint64(v) > math.MaxUint32 { // negative too
			x.toksRange = true
		}
		x.ids = append(x.ids, uint32(v))
	next:
		switch c := x.s.peek(); {
		case c == ',':
			x.s.i++
			goto next
		case c == '-' || (c >= '0' && c <= '9'):
		default:
			x.addTokens(start)
			return true
		}
	}
}

// addTokens records ids[start:] as prompt pieces (extending a run that
// ends there) and, while recording it, as the first token list.
func (x *Index) addTokens(start int) {
	end := len(x.ids)
	if end == start {
		return
	}
	if x.toksOn {
		x.toksTo += end - start
	}
	if x.live != nil {
		for _, id := range x.ids[start:end] {
			x.live.Token(id)
		}
	}
	if n := len(x.pieces); n > 0 && x.pieces[n-1].kind == pieceTokens && int(x.pieces[n-1].end) == start {
		x.pieces[n-1].end = int32(end)
		return
	}
	x.pieces = append(x.pieces, piece{off: int32(start), end: int32(end), kind: pieceTokens})
}

func onlyWS(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}
