package cluster

import (
	"slices"
	"testing"
)

func TestWireRoundTrip(t *testing.T) {
	b := appendHeader(nil, "node-a", "llama_mixed", 256)
	b = appendRecord(b, "llama-0", []uint64{1, 2, 1 << 63})
	b = appendRecord(b, "llama-1", nil)
	h, n, err := validate(b)
	if err != nil || n != 2 || string(h.origin) != "node-a" || string(h.pool) != "llama_mixed" || h.blockBytes != 256 {
		t.Fatalf("validate: %+v n=%d err=%v", h, n, err)
	}
	ep, blocks, rest, err := nextRecord(h.rest, nil)
	if err != nil || string(ep) != "llama-0" || !slices.Equal(blocks, []uint64{1, 2, 1 << 63}) {
		t.Fatalf("record 1: %s %v %v", ep, blocks, err)
	}
	ep, blocks, rest, err = nextRecord(rest, blocks)
	if err != nil || string(ep) != "llama-1" || len(blocks) != 0 || len(rest) != 0 {
		t.Fatalf("record 2: %s %v %v rest %d", ep, blocks, err, len(rest))
	}
	// A strict prefix of a valid message is refused unless it ends exactly
	// on a record boundary (then it is a valid shorter batch): never is a
	// record applied in part.
	boundary := map[int]int{
		len(appendHeader(nil, "node-a", "llama_mixed", 256)):                                                   0,
		len(appendRecord(appendHeader(nil, "node-a", "llama_mixed", 256), "llama-0", []uint64{1, 2, 1 << 63})): 1,
	}
	for i := 0; i < len(b); i++ {
		_, n, err := validate(b[:i])
		want, ok := boundary[i]
		switch {
		case ok && (err != nil || n != want):
			t.Errorf("prefix %d (a record boundary): n=%d err=%v, want %d records", i, n, err, want)
		case !ok && err == nil:
			t.Errorf("prefix %d of %d accepted (%d records)", i, len(b), n)
		}
	}
}

// Decoding arbitrary bytes never panics and never reads out of bounds.
func FuzzValidate(f *testing.F) {
	f.Add(appendRecord(appendHeader(nil, "a", "p", 64), "e", []uint64{7}))
	f.Add([]byte("TPX1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := validate(b)
		if err != nil {
			return
		}
		rest := h.rest
		var buf []uint64
		for i := 0; i < n; i++ {
			if _, buf, rest, err = nextRecord(rest, buf); err != nil {
				t.Fatalf("validated message failed to decode: %v", err)
			}
		}
		if len(rest) != 0 {
			t.Fatal("validated message has trailing bytes")
		}
	})
}
