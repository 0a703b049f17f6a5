package payload

import "bytes"

// The scanner: one forward pass, no recursion (deep nesting cannot blow the
// stack), views into the body only. It tolerates a body cut at any byte (the
// proxy may forward a prefix): everything complete before the cut is used,
// and a string cut in the middle is used up to the cut. It is written here
// rather than taken from sonic or encoding/json because both allocate per
// value found (sonic's ast: one allocation per path, measured), and the
// decision path must not allocate.

type scanner struct {
	b []byte
	i int
}

// ws and peek run ~100 times per chat body and usually find no space:
// one test (c > ' ') settles every byte that is not whitespace, and peek
// reads the byte once (ws then a second bounds check cost ~40% more).
func (s *scanner) ws() {
	for s.i < len(s.b) {
		if c := s.b[s.i]; c > ' ' || (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			return
		}
		s.i++
	}
}

func (s *scanner) peek() byte {
	for s.i < len(s.b) {
		if c := s.b[s.i]; c > ' ' || (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			return c
		}
		s.i++
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

// object iterates the keys of an object at the cursor. fn is called with
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
