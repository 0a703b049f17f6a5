package route

// The body edit of prefill/decode: the proxy glue inserts the prefill's
// kv_transfer_params into the request it sends the decode replica. turnout
// computes the edit (BodyEdit); the glue only inserts bytes at an offset and
// sets the new Content-Length, so the rule lives here once.
const (
	// BodyEditKey starts the inserted text: the key, then the JSON object.
	BodyEditKey = `"kv_transfer_params":`
	// BodyEditSep ends the inserted text unless the body's object is empty.
	BodyEditSep = ","
)

// BodyEdit returns the text to insert into body (a JSON object that
// turnout checked) and the 0-based offset it goes to, just after the
// opening brace: BodyEditKey, kv, then BodyEditSep unless the object is
// empty. at is -1 when body has no opening brace. The result is exactly
// DecodeBody's. ins is appended to dst.
func BodyEdit(body, kv, dst []byte) (ins []byte, at int) {
	at = -1
	for i, c := range body {
		if c == '{' {
			at = i + 1
			break
		}
		if !bodyEditWS(c) {
			return nil, -1
		}
	}
	if at < 0 {
		return nil, -1
	}
	ins = append(append(dst, BodyEditKey...), kv...)
	for _, c := range body[at:] {
		if c == '}' {
			return ins, at
		}
		if !bodyEditWS(c) {
			break
		}
	}
	return append(ins, BodyEditSep...), at
}

func bodyEditWS(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
