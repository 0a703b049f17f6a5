package contract

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Decision ids go out as 16 hex digits and come back in /internal/done.
func TestAppendID(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	ids := []uint64{0, 1, 0xff, 0x0123456789abcdef, 0xfedcba9876543210, 1<<64 - 1}
	for d := uint64(0); d < 16; d++ { // every digit in every place
		for at := 0; at < 64; at += 4 {
			ids = append(ids, d<<at, d<<at|^(0xf<<at))
		}
	}
	for range 10000 {
		ids = append(ids, rnd.Uint64())
	}
	for _, id := range ids {
		got := appendID([]byte("x"), id)
		if want := fmt.Sprintf("x%016x", id); string(got) != want {
			t.Fatalf("appendID(%#x) = %q, want %q", id, got, want)
		}
		if back, ok := ParseDecisionID(got[1:]); !ok || back != id {
			t.Fatalf("ParseDecisionID(%q) = %#x %v", got[1:], back, ok)
		}
	}
}
