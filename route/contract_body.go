package route

import "github.com/turnout/turnout/route/payload"

// The body edit of prefill/decode: the proxy glue inserts the prefill's
// kv_transfer_params into the request it sends the decode replica. turnout
// computes the edit (BodyEdit); the glue only inserts bytes at an offset and
// sets the new Content-Length, so the rule lives here once.
const (
	// BodyEditKey starts the inserted text: the key, then the JSON object.
	BodyEditKey = payload.EditKey
	// BodyEditSep ends the inserted text unless the body's object is empty.
	BodyEditSep = payload.EditSep
)

// BodyEdit returns the text to insert into body (a JSON object) and the
// 0-based offset it goes to, just after the opening brace (payload.Edit on
// a fresh index): at is -1 when body is not one JSON object. ins is
// appended to dst. Decisions use payload.Edit on their request's index.
func BodyEdit(body, kv, dst []byte) (ins []byte, at int) {
	var x payload.Index
	x.Build(body, false)
	return payload.Edit(&x, kv, dst)
}
