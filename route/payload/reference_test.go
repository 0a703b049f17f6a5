package payload

import (
	"errors"
	"strconv"
)

// The per-question scanners the Index replaced (route/payload.go and
// route/pd.go before the one pass), kept verbatim as the reference the
// one-pass Index must agree with (TestIndexMatchesReference, FuzzIndex).

type refSink interface {
	text(p []byte)
	sep(b byte)
	token(id int64)
}

func refFindModel(body []byte) []byte {
	s := scanner{b: body}
	var model []byte
	s.object(func(key []byte) bool {
		if string(key) == "model" {
			if v, complete, ok := s.str(); ok && complete {
				model = v
			}
			return false
		}
		return s.skip()
	})
	return model
}

func refHasKey(body []byte, name string) bool {
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

func refIsObject(body []byte) bool {
	s := scanner{b: body}
	if s.peek() != '{' || !s.skip() {
		return false
	}
	s.ws()
	return s.i == len(s.b)
}

func refValueFrom(body []byte, name string) []byte {
	s := scanner{b: body}
	var v []byte
	s.object(func(key []byte) bool {
		if string(key) == name {
			s.ws()
			v = s.b[s.i:]
			return false
		}
		return s.skip()
	})
	return v
}

// refTokenPrompt is route's tokenPrompt without the kv.TokenID range check.
func refTokenPrompt(body []byte, dst []int64) ([]int64, bool) {
	s := scanner{b: refValueFrom(body, "prompt")}
	if s.peek() != '[' {
		return dst, false
	}
	s.i++
	if s.peek() == '[' {
		s.i++
	}
	for {
		switch c := s.peek(); {
		case c == ',':
			s.i++
		case c == '-' || (c >= '0' && c <= '9'):
			v, ok := s.int()
			if !ok {
				return dst, false
			}
			dst = append(dst, v)
		case c == ']':
			return dst, len(dst) > 0
		default:
			return dst, false
		}
	}
}

func refWalkPrompt(body []byte, sink refSink) bool {
	w := refWalker{s: scanner{b: body}, sink: sink}
	w.s.object(w.topKey)
	return w.found
}

type refWalker struct {
	s     scanner
	sink  refSink
	found bool
}

func (w *refWalker) topKey(key []byte) bool {
	switch string(key) {
	case "messages", "input":
		w.found = true
		if w.s.peek() == '"' {
			return w.text()
		}
		return w.s.array(w.message)
	case "prompt":
		w.found = true
		return w.prompt()
	}
	return w.s.skip()
}

func (w *refWalker) text() bool {
	v, complete, ok := w.s.str()
	if !ok {
		return false
	}
	w.sink.text(v)
	return complete
}

func (w *refWalker) message() bool {
	if w.s.peek() == '"' {
		if !w.text() {
			return false
		}
		w.sink.sep(SepMessage)
		return true
	}
	ok := w.s.object(w.messageKey)
	w.sink.sep(SepMessage)
	return ok
}

func (w *refWalker) messageKey(key []byte) bool {
	switch string(key) {
	case "role":
		if !w.text() {
			return false
		}
		w.sink.sep(SepRole)
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

func (w *refWalker) part() bool {
	if w.s.peek() == '"' {
		return w.text()
	}
	return w.s.object(w.partKey)
}

func (w *refWalker) partKey(key []byte) bool {
	if string(key) == "text" && w.s.peek() == '"' {
		return w.text()
	}
	return w.s.skip()
}

func (w *refWalker) prompt() bool {
	switch w.s.peek() {
	case '"':
		return w.text()
	case '[':
		return w.s.array(w.promptElem)
	}
	return w.s.skip()
}

func (w *refWalker) promptElem() bool {
	switch c := w.s.peek(); {
	case c == '"':
		if !w.text() {
			return false
		}
		w.sink.sep(SepPart)
		return true
	case c == '[':
		ok := w.s.array(w.tokenElem)
		w.sink.sep(SepPart)
		return ok
	case c == '-' || (c >= '0' && c <= '9'):
		return w.tokenElem()
	}
	return w.s.skip()
}

func (w *refWalker) tokenElem() bool {
	v, ok := w.s.int()
	if !ok {
		return w.s.skip()
	}
	w.sink.token(v)
	return true
}

func refPrefillBody(body []byte) ([]byte, error) {
	if !refIsObject(body) {
		return nil, errors.New("prefill body: not a JSON object")
	}
	out := make([]byte, 0, len(body)+len(PrefillKV)+64)
	out = append(out, '{')
	s := scanner{b: body}
	sawMax, sawStream := false, false
	first := true
	emit := func(key string, raw []byte) {
		if !first {
			out = append(out, ',')
		}
		first = false
		out = strconv.AppendQuote(out, key)
		out = append(out, ':')
		out = append(out, raw...)
	}
	ok := s.object(func(key []byte) bool {
		s.ws()
		start := s.i
		if !s.skip() {
			return false
		}
		raw := s.b[start:s.i]
		switch string(key) {
		case "max_tokens":
			sawMax = true
			raw = []byte("1")
		case "max_completion_tokens":
			raw = []byte("1")
		case "stream":
			sawStream = true
			raw = []byte("false")
		case "stream_options", "kv_transfer_params":
			return true
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		// Copy the key raw too, so escapes in keys survive unchanged.
		out = append(out, '"')
		out = append(out, key...)
		out = append(out, '"', ':')
		out = append(out, raw...)
		return true
	})
	if !ok {
		return nil, errors.New("prefill body: malformed JSON object")
	}
	if !sawMax {
		emit("max_tokens", []byte("1"))
	}
	if !sawStream {
		emit("stream", []byte("false"))
	}
	emit("kv_transfer_params", []byte(PrefillKV))
	return append(out, '}'), nil
}
