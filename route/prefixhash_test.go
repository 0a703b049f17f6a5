package route

import (
	"fmt"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/payload"
)

// indexOf indexes a body as the handler does.
func indexOf(body string) *payload.Index {
	var x payload.Index
	x.Build([]byte(body), false)
	return &x
}

func TestPrefixHasherSharedPrefix(t *testing.T) {
	var h1, h2 prefixHasher
	sys := strings.Repeat("You are a helpful assistant. ", 40)
	h1.reset(64, make([]uint64, 0, 128))
	indexOf(chatBody("m", sys, strings.Repeat("first question ", 20))).Prompt(&h1)
	h2.reset(64, make([]uint64, 0, 128))
	indexOf(chatBody("m", sys, strings.Repeat("another one entirely ", 20))).Prompt(&h2)
	shared := 0
	for shared < len(h1.out) && shared < len(h2.out) && h1.out[shared] == h2.out[shared] {
		shared++
	}
	// The system prompt plus its role header spans (7+1+len(sys))/64 full blocks.
	if want := (len("system") + 1 + len(sys)) / 64; shared != want {
		t.Fatalf("shared blocks = %d, want %d", shared, want)
	}
	if h1.out[len(h1.out)-1] == h2.out[len(h2.out)-1] {
		t.Fatal("different prompts ended in the same block hash")
	}
}

// Blocks hashed in place and blocks assembled across pieces must agree, or
// the same prompt would hash differently depending on its JSON layout.
func TestPrefixHasherPieces(t *testing.T) {
	text := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40))
	var whole prefixHasher
	whole.reset(64, make([]uint64, 0, 64))
	whole.Text(text)
	for _, cut := range []int{1, 7, 63, 64, 65, 200} {
		var h prefixHasher
		h.reset(64, make([]uint64, 0, 64))
		for p := text; len(p) > 0; {
			n := min(cut, len(p))
			h.Text(p[:n])
			p = p[n:]
		}
		if fmt.Sprint(h.out) != fmt.Sprint(whole.out) || h.total != whole.total {
			t.Fatalf("pieces of %d hash differently", cut)
		}
	}
}
