package route

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// The body edit turnout sends the glue must rebuild exactly DecodeBody,
// which the Lua, njs and SPOE paths are held to.
func TestBodyEditMatchesDecodeBody(t *testing.T) {
	kv := `{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":5}`
	for _, body := range []string{
		`{"model":"m","stream":true}`,
		` { } `,
		"\n{\"messages\":[{\"content\":\"日本語 \\\"q\\\"\"}],\"n\":1e3}",
		`{"a":{"b":{}}}`,
	} {
		ins, at := contract.BodyEdit([]byte(body), []byte(kv), nil)
		if at < 0 {
			t.Fatalf("%q: refused", body)
		}
		got := body[:at] + string(ins) + body[at:]
		want, err := DecodeBody([]byte(body), []byte(kv))
		if err != nil || got != string(want) {
			t.Fatalf("body %q:\n got %s\nwant %s (%v)", body, got, want, err)
		}
	}
	for _, bad := range []string{``, `[1]`, `x{}`} {
		if _, at := contract.BodyEdit([]byte(bad), []byte(kv), nil); at >= 0 {
			t.Fatalf("body %q accepted", bad)
		}
	}
}

// A warm Decide allocates nothing (the SPOE agent calls it directly).
func TestDecideAllocs(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity"))
	var in contract.Input
	in.AddHeader([]byte("x-session-id"), []byte("u"))
	in.Body = []byte(body4K(1))
	var v contract.Verdict
	run := func() {
		s.Decide(&in, &v)
		if !v.Routed() {
			t.Fatalf("status %d", v.Status)
		}
		s.Ledger().Complete(v.Decision)
	}
	for range 100 {
		run()
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("%v allocations per decision", n)
	}
}
