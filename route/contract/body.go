package contract

import "github.com/turnout/turnout/route/payload"

// The body edit of prefill/decode: the proxy glue inserts the prefill's
// kv_transfer_params into the request it sends the decode replica. turnout
// computes the edit (payload.Edit, where the rule is written once); the
// glue only inserts bytes at an offset and sets the new Content-Length.

// BodyEdit returns the text to insert into body (a JSON object) and the
// 0-based offset it goes to, just after the opening brace (payload.Edit on
// a fresh index): at is -1 when body is not one JSON object. ins is
// appended to dst. Decisions use payload.Edit on their request's index;
// this form is for checking a glue's insertion against a raw body.
func BodyEdit(body, kv, dst []byte) (ins []byte, at int) {
	var x payload.Index
	x.Build(body, false)
	return payload.Edit(&x, kv, dst)
}
