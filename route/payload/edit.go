package payload

import (
	"errors"
	"strconv"
)

// PrefillKV is the kv_transfer_params a prefill request carries (vLLM's
// NIXL connector protocol: compute the prompt, keep the blocks for a remote
// decode).
const PrefillKV = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// KVTransferKey is the body key prefill/decode exchanges its parameters in.
const KVTransferKey = "kv_transfer_params"

// PrefillBody rewrites the indexed body for the prefill replica: max_tokens
// 1 (and max_completion_tokens 1 when present), stream false, no
// stream_options, and kv_transfer_params asking for a remote decode. Every
// other member is copied byte for byte, in order (numbers, unicode and
// escapes in keys untouched), from the Index's member spans.
func PrefillBody(x *Index) ([]byte, error) {
	if !x.Object() {
		return nil, errors.New("prefill body: not a JSON object")
	}
	out := make([]byte, 0, len(x.body)+len(PrefillKV)+64)
	out = append(out, '{')
	sawMax, sawStream := false, false
	first := true
	emit := func(key, raw []byte, quote bool) {
		if !first {
			out = append(out, ',')
		}
		first = false
		if quote {
			out = strconv.AppendQuote(out, string(key))
		} else {
			// A key copied raw, so escapes in keys survive unchanged.
			out = append(append(append(out, '"'), key...), '"')
		}
		out = append(out, ':')
		out = append(out, raw...)
	}
	for _, m := range x.Members() {
		key, raw := x.Raw(m.Key), x.Raw(m.Value)
		switch string(key) {
		case "max_tokens":
			sawMax = true
			raw = []byte("1")
		case "max_completion_tokens":
			raw = []byte("1")
		case "stream":
			sawStream = true
			raw = []byte("false")
		case "stream_options", KVTransferKey:
			continue
		}
		emit(key, raw, false)
	}
	if !sawMax {
		emit([]byte("max_tokens"), []byte("1"), true)
	}
	if !sawStream {
		emit([]byte("stream"), []byte("false"), true)
	}
	emit([]byte(KVTransferKey), []byte(PrefillKV), true)
	return append(out, '}'), nil
}

// The decode body's edit: EditKey, the prefill's kv_transfer_params, then
// EditSep unless the object is empty, inserted just after the opening
// brace. The proxy glue only inserts these bytes (route/contract/body.go
// carries the rule to it); this is the one place it is written.
const (
	EditKey = `"` + KVTransferKey + `":`
	EditSep = ","
)

// Edit returns the text to insert into the indexed body for the decode
// replica (appended to dst) and the 0-based offset it goes to; at is -1
// when the body is not one JSON object.
func Edit(x *Index, kv, dst []byte) (ins []byte, at int) {
	if !x.Object() {
		return nil, -1
	}
	ins = append(append(dst, EditKey...), kv...)
	if !x.empty {
		ins = append(ins, EditSep...)
	}
	return ins, x.open + 1
}

// DecodeBody inserts kv_transfer_params (a raw JSON object) into the indexed
// body right after its opening brace, as the proxy glue does for the decode
// replica (Edit); it is the reference the Lua and njs implementations are
// tested against.
func DecodeBody(x *Index, kv []byte) ([]byte, error) {
	ins, at := Edit(x, kv, nil)
	if at < 0 {
		return nil, errors.New("decode body: not a JSON object")
	}
	out := make([]byte, 0, len(x.body)+len(ins))
	out = append(out, x.body[:at]...)
	out = append(out, ins...)
	return append(out, x.body[at:]...), nil
}
