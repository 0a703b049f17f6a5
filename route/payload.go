package route

import "bytes"

// Routing reads only a few fields of an OpenAI request body. sonic's ast
// allocates for every node it returns (measured: one allocation per found
// path), and the decision path must not allocate, so this is a small
// purpose-built scanner: one forward pass, no recursion (deep nesting cannot
// blow the stack), views into the body only. It tolerates a body cut at any
// byte (the proxy may forward a prefix): everything complete before the cut
// is used, and a string cut in the middle is used up to the cut.

// promptSink receives the prompt in order.
type promptSink interface {
	text(p []byte) // a piece of text (raw JSON string content, escapes kept)
	sep(b byte)    // a structural boundary (role change, message end)
	token(id int64)
}

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// str reads a string at the cursor and returns its raw content. complete is
// false when the body ends inside the string (content is then the partial
// text, minus a dangling escape).
func (s *scanner) str() (content []byte, complete, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	s.i++
	start := s.i
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			end := len(s.b)
			// Drop a trailing partial escape so callers never see "\".
			k := end
			for k > start && s.b[k-1] == '\\' {
				k--
			}
			if (end-k)%2 == 1 {
				end--
			}
			s.i = len(s.b)
			return s.b[start:end], false, true
		}
		q := s.i + j
		// The quote is escaped when preceded by an odd run of backslashes.
		k := q
		for k > start && s.b[k-1] == '\\' {
			k--
		}
		if (q-k)%2 == 0 {
			s.i = q + 1
			return s.b[start:q], true, true
		}
		s.i = q + 1
	}
}

// skip skips one value of any type iteratively; false on malformed input or EOF.
func (s *scanner) skip() bool {
	depth := 0
	for {
		switch c := s.peek(); c {
		case 0:
			return false
		case '"':
			if _, complete, _ := s.str(); !complete {
				return false
			}
		case '{', '[':
			depth++
			s.i++
			continue
		case '}', ']':
			if depth == 0 {
				return false
			}
			depth--
			s.i++
		case ',', ':':
			if depth == 0 {
				return false
			}
			s.i++
			continue
		default:
			// number, true, false, null: run to the next delimiter.
			start := s.i
			for s.i < len(s.b) {
				c := s.b[s.i]
				if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == ':' {
					break
				}
				s.i++
			}
			if s.i == start {
				return false
			}
		}
		if depth == 0 {
			return true
		}
	}
}

// objectKeys iterates the keys of an object at the cursor. fn is called with
// the cursor on the value and must consume it; it returns false to stop.
func (s *scanner) object(fn func(key []byte) bool) bool {
	if s.peek() != '{' {
		return false
	}
	s.i++
	for {
		switch s.peek() {
		case '}':
			s.i++
			return true
		case ',':
			s.i++
			continue
		case '"':
		default:
			return false
		}
		key, complete, _ := s.str()
		if !complete || s.peek() != ':' {
			return false
		}
		s.i++
		if !fn(key) {
			return false
		}
	}
}

// array iterates the elements of an array at the cursor; fn must consume one value.
func (s *scanner) array(fn func() bool) bool {
	if s.peek() != '[' {
		return false
	}
	s.i++
	for {
		switch s.peek() {
		case ']':
			s.i++
			return true
		case ',':
			s.i++
			continue
		case 0:
			return false
		}
		if !fn() {
			return false
		}
	}
}

// int reads an integer at the cursor.
func (s *scanner) int() (int64, bool) {
	s.ws()
	neg := false
	if s.i < len(s.b) && s.b[s.i] == '-' {
		neg = true
		s.i++
	}
	start := s.i
	var v int64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		v = v*10 + int64(s.b[s.i]-'0')
		s.i++
	}
	if s.i == start || s.i-start > 18 { // more digits could wrap int64
		return 0, false
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

// findModel returns the raw content of the top-level "model" string.
func findModel(body []byte) []byte {
	s := scanner{b: body}
	var model []byte
	s.object(func(key []byte) bool {
		if string(key) == "model" {
			if v, complete, ok := s.str(); ok && complete {
				model = v
			}
			return false // found (or unusable): stop scanning
		}
		return s.skip()
	})
	return model
}

// hasKey reports whether the top-level object has key (used for PD checks).
func hasKey(body []byte, name string) bool {
	s := scanner{b: body}
	found := false
	s.object(func(key []byte) bool {
		if string(key) == name {
			found = true
			return false
		}
		return s.skip()
	})
	return found
}

// Separator bytes fed to the sink so "ab"+"c" and "a"+"bc" differ and roles count.
const (
	sepMessage = 0x1e // record separator: end of a message
	sepRole    = 0x1f // unit separator: between role and content
	sepPart    = 0x1d // between prompts of a batch
)

// walkPrompt feeds the request's prompt to sink in order: chat "messages",
// completions "prompt", Responses "input". It reports whether a prompt field
// was found. The walker is written out per shape (not generic) so the hot path
// makes no closures that escape.
func walkPrompt(body []byte, sink promptSink) bool {
	w := promptWalker{s: scanner{b: body}, sink: sink}
	w.s.object(w.topKey)
	return w.found
}

type promptWalker struct {
	s     scanner
	sink  promptSink
	found bool
}

func (w *promptWalker) topKey(key []byte) bool {
	switch string(key) {
	case "messages", "input":
		w.found = true
		if w.s.peek() == '"' { // Responses input as a plain string
			return w.text()
		}
		return w.s.array(w.message)
	case "prompt":
		w.found = true
		return w.prompt()
	}
	return w.s.skip()
}

func (w *promptWalker) text() bool {
	v, complete, ok := w.s.str()
	if !ok {
		return false
	}
	w.sink.text(v)
	return complete
}

// message handles one chat message or Responses input item.
func (w *promptWalker) message() bool {
	if w.s.peek() == '"' { // Responses input may list plain strings
		if !w.text() {
			return false
		}
		w.sink.sep(sepMessage)
		return true
	}
	ok := w.s.object(w.messageKey)
	w.sink.sep(sepMessage)
	return ok
}

func (w *promptWalker) messageKey(key []byte) bool {
	switch string(key) {
	case "role":
		if !w.text() {
			return false
		}
		w.sink.sep(sepRole)
		return true
	case "content":
		switch w.s.peek() {
		case '"':
			return w.text()
		case '[':
			return w.s.array(w.part)
		}
	}
	return w.s.skip()
}

// part handles one content part; only text parts count (images are skipped).
func (w *promptWalker) part() bool {
	if w.s.peek() == '"' {
		return w.text()
	}
	return w.s.object(w.partKey)
}

func (w *promptWalker) partKey(key []byte) bool {
	// "text" carries text for type text/input_text/output_text; image parts
	// have no "text" key, so their payload is skipped with everything else.
	if string(key) == "text" && w.s.peek() == '"' {
		return w.text()
	}
	return w.s.skip()
}

// prompt handles completions: string, [string], [int], [[int]].
func (w *promptWalker) prompt() bool {
	switch w.s.peek() {
	case '"':
		return w.text()
	case '[':
		return w.s.array(w.promptElem)
	}
	return w.s.skip()
}

func (w *promptWalker) promptElem() bool {
	switch c := w.s.peek(); {
	case c == '"':
		if !w.text() {
			return false
		}
		w.sink.sep(sepPart)
		return true
	case c == '[':
		ok := w.s.array(w.tokenElem)
		w.sink.sep(sepPart)
		return ok
	case c == '-' || (c >= '0' && c <= '9'):
		return w.tokenElem()
	}
	return w.s.skip()
}

func (w *promptWalker) tokenElem() bool {
	v, ok := w.s.int()
	if !ok {
		return w.s.skip()
	}
	w.sink.token(v)
	return true
}
