package spoe

import (
	"encoding/base64"
	"testing"

	"github.com/turnout/turnout/route"
)

// The agent's insertion text and offset must rebuild exactly route.DecodeBody,
// which the Lua path and the njs path are held to as well.
func TestKVInsertMatchesDecodeBody(t *testing.T) {
	kv := `{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":5}`
	d := newDecider(nil, nil)
	for _, body := range []string{
		`{"model":"m","stream":true}`,
		` { } `,
		"\n{\"messages\":[{\"content\":\"日本語 \\\"q\\\"\"}],\"n\":1e3}",
		`{"a":{"b":{}}}`,
	} {
		at, ok := d.kvInsert([]byte(base64.StdEncoding.EncodeToString([]byte(kv))), []byte(body))
		if !ok {
			t.Fatalf("%q: refused", body)
		}
		got := body[:at] + string(d.kv) + body[at:]
		want, err := route.DecodeBody([]byte(body), []byte(kv))
		if err != nil || got != string(want) {
			t.Fatalf("body %q:\n got %s\nwant %s (%v)", body, got, want, err)
		}
	}
	for _, bad := range []string{"not base64!", base64.StdEncoding.EncodeToString([]byte(`[1]`)), ""} {
		if _, ok := d.kvInsert([]byte(bad), []byte(`{}`)); ok {
			t.Fatalf("kv %q accepted", bad)
		}
	}
}
