package fleet

import (
	"fmt"
	"math/rand/v2"
	"slices"
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
	var h1, h2 PrefixHasher
	sys := strings.Repeat("You are a helpful assistant. ", 40)
	h1.Reset(64, make([]uint64, 0, 128))
	indexOf(chatJSON("m", sys, strings.Repeat("first question ", 20))).Prompt(&h1)
	h2.Reset(64, make([]uint64, 0, 128))
	indexOf(chatJSON("m", sys, strings.Repeat("another one entirely ", 20))).Prompt(&h2)
	shared := 0
	for shared < len(h1.Out) && shared < len(h2.Out) && h1.Out[shared] == h2.Out[shared] {
		shared++
	}
	// The system prompt plus its role header spans (7+1+len(sys))/64 full blocks.
	if want := (len("system") + 1 + len(sys)) / 64; shared != want {
		t.Fatalf("shared blocks = %d, want %d", shared, want)
	}
	if h1.Out[len(h1.Out)-1] == h2.Out[len(h2.Out)-1] {
		t.Fatal("different prompts ended in the same block hash")
	}
}

// Blocks hashed in place and blocks assembled across pieces must agree, or
// the same prompt would hash differently depending on its JSON layout.
func TestPrefixHasherPieces(t *testing.T) {
	text := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40))
	var whole PrefixHasher
	whole.Reset(64, make([]uint64, 0, 64))
	whole.Text(text)
	for _, cut := range []int{1, 7, 63, 64, 65, 200} {
		var h PrefixHasher
		h.Reset(64, make([]uint64, 0, 64))
		for p := text; len(p) > 0; {
			n := min(cut, len(p))
			h.Text(p[:n])
			p = p[n:]
		}
		if fmt.Sprint(h.Out) != fmt.Sprint(whole.Out) || h.Total != whole.Total {
			t.Fatalf("pieces of %d hash differently", cut)
		}
	}
}

// refHasher is prefixHasher.Text as first written (a block at a time
// through h.block): the chained hashes of any split of any prompt, at any
// block size and bound, must stay what it gives.
type refHasher struct{ PrefixHasher }

func (h *refHasher) Text(p []byte) {
	h.Total += len(p)
	for len(p) > 0 {
		if len(h.Out) == cap(h.Out) {
			return
		}
		if h.n == 0 && len(p) >= h.blockSize {
			h.block(p[:h.blockSize])
			p = p[h.blockSize:]
			continue
		}
		c := copy(h.buf[h.n:h.blockSize], p)
		h.n += c
		p = p[c:]
		if h.n == h.blockSize {
			h.block(h.buf[:h.n])
			h.n = 0
		}
	}
}

func TestPrefixHasherMatchesReference(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 8))
	text := make([]byte, 3000)
	for i := range text {
		text[i] = byte(rnd.Uint32())
	}
	for _, bs := range []int{16, 17, 64, 256, 4096} {
		for _, maxBlocks := range []int{0, 1, 3, 1000} {
			for k := 0; k < 50; k++ {
				var got PrefixHasher
				var want refHasher
				got.Reset(bs, make([]uint64, 0, maxBlocks))
				want.Reset(bs, make([]uint64, 0, maxBlocks))
				for p := text[:rnd.IntN(len(text))]; len(p) > 0; {
					n := min(len(p), 1+rnd.IntN(2*bs))
					if k%5 == 0 {
						n = min(len(p), 1+rnd.IntN(8)) // separators, token ids
					}
					got.Text(p[:n])
					want.Text(p[:n])
					p = p[n:]
				}
				if !slices.Equal(got.Out, want.Out) || got.Total != want.Total || got.n != want.n || got.prev != want.prev {
					t.Fatalf("block %d, max %d: %d blocks (n %d), reference %d (n %d)", bs, maxBlocks, len(got.Out), got.n, len(want.Out), want.n)
				}
			}
		}
	}
}

// chatJSON builds a chat request with a system prompt and a user message.
func chatJSON(model, system, user string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"stream":true}`, model, system, user)
}

// An adapter's prompt hashes apart from the base model's and from another
// adapter's at every block; a base-model request hashes exactly as Reset.
func TestPrefixHasherAdapterKey(t *testing.T) {
	body := indexOf(chatJSON("m", strings.Repeat("You are a helpful assistant. ", 40), "hi"))
	hash := func(r *Request) []uint64 {
		var h PrefixHasher
		h.ResetFor(r, 64, make([]uint64, 0, 64))
		body.Prompt(&h)
		return h.Out
	}
	var plain PrefixHasher
	plain.Reset(64, make([]uint64, 0, 64))
	body.Prompt(&plain)
	base := hash(&Request{Model: []byte("m")})
	if !slices.Equal(base, plain.Out) || len(base) < 2 {
		t.Fatalf("base model: ResetFor %x, Reset %x", base, plain.Out)
	}
	a := hash(&Request{Adapter: true, AdapterHash: HashKey([]byte("lora-a"))})
	b := hash(&Request{Adapter: true, AdapterHash: HashKey([]byte("lora-b"))})
	a2 := hash(&Request{Adapter: true, AdapterHash: HashKey([]byte("lora-a"))})
	if !slices.Equal(a, a2) {
		t.Fatal("one adapter hashed one prompt two ways")
	}
	for i := range base {
		if a[i] == base[i] || a[i] == b[i] {
			t.Fatalf("block %d: adapter a %x, adapter b %x, base %x: want all apart", i, a[i], b[i], base[i])
		}
	}
}
