package payload

// Helpers for the small JSON documents around a request -- replica answers
// (a prefill's kv_transfer_params, /tokenize's tokens) and the /tokenize
// call -- on the same scanner. They are not for the request body, which is
// read once by Build.

// TopValue returns the raw JSON value of the first top-level key of the
// object in doc, or nil.
func TopValue(doc []byte, name string) []byte {
	s := scanner{b: doc}
	var v []byte
	s.object(func(key []byte) bool {
		s.ws()
		start := s.i
		if !s.skip() {
			return false
		}
		if string(key) == name {
			v = s.b[start:s.i]
			return false
		}
		return true
	})
	return v
}

// AppendInts appends the elements of a JSON array of integers; ok is false
// when raw is not such an array.
func AppendInts(dst []int64, raw []byte) ([]int64, bool) {
	s := scanner{b: raw}
	ok := s.array(func() bool {
		v, ok := s.int()
		if ok {
			dst = append(dst, v)
		}
		return ok
	})
	return dst, ok
}

// AppendString appends b quoted as a JSON string.
func AppendString(dst, b []byte) []byte {
	dst = append(dst, '"')
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, `\u00`...)
			dst = append(dst, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
