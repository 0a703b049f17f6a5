package route

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Decision ids go out as 16 hex digits and come back in /internal/done.
func TestAppendID(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	for _, id := range []uint64{0, 1, 0xff, 0x0123456789abcdef, 1<<64 - 1, rnd.Uint64(), rnd.Uint64()} {
		got := appendID([]byte("x"), id)
		if want := fmt.Sprintf("x%016x", id); string(got) != want {
			t.Fatalf("appendID(%#x) = %q, want %q", id, got, want)
		}
		if back, ok := parseID(got[1:]); !ok || back != id {
			t.Fatalf("parseID(%q) = %#x %v", got[1:], back, ok)
		}
	}
}
