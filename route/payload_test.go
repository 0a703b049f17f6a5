package route

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// viewSink checks that text pieces are ordered sub-slices of body.
type viewSink struct {
	body []byte
	last uintptr
	t    *testing.T
}

func (v *viewSink) text(p []byte) {
	if len(p) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(v.body)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	if at < start || at+uintptr(len(p)) > start+uintptr(len(v.body)) || at < v.last {
		v.t.Fatalf("text piece %q is not an ordered view into the body", p)
	}
	v.last = at + uintptr(len(p))
}
func (v *viewSink) sep(byte)    {}
func (v *viewSink) token(int64) {}

// recSink records the prompt stream for assertions.
type recSink struct{ b bytes.Buffer }

func (r *recSink) text(p []byte)  { r.b.Write(p) }
func (r *recSink) sep(c byte)     { r.b.WriteByte('|') }
func (r *recSink) token(id int64) { fmt.Fprintf(&r.b, "<%d>", id) }

func TestFindModel(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"first", `{"model":"llama","messages":[]}`, "llama"},
		{"after messages", `{"messages":[{"role":"user","content":"hi \"x\" }"}],"model":"m2"}`, "m2"},
		{"spaces", "{ \"model\" : \"a b\" }", "a b"},
		{"nested model ignored", `{"x":{"model":"no"},"model":"yes"}`, "yes"},
		{"not string", `{"model":5}`, ""},
		{"missing", `{"messages":[]}`, ""},
		{"garbage", `not json at all`, ""},
		{"array", `["model","x"]`, ""},
		{"truncated before", `{"messages":[{"role":"user","content":"abc`, ""},
		{"truncated inside model", `{"model":"lla`, ""},
		{"empty", ``, ""},
		{"escaped slash raw", `{"model":"meta\/llama"}`, `meta\/llama`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(findModel([]byte(tc.body))); got != tc.want {
				t.Fatalf("findModel = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWalkPrompt(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		found            bool
	}{
		{"chat string", `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}`, "system|S|user|U|", true},
		{"chat parts skip image", `{"messages":[{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"B"}]}]}`, "user|AB|", true},
		{"chat null content", `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`, "assistant||", true},
		{"prompt string", `{"prompt":"hello world"}`, "hello world", true},
		{"prompt strings", `{"prompt":["a","b"]}`, "a|b|", true},
		{"prompt tokens", `{"prompt":[1,2,-3]}`, "<1><2><-3>", true},
		{"prompt token arrays", `{"prompt":[[1,2],[3]]}`, "<1><2>|<3>|", true},
		{"responses string", `{"input":"tell me"}`, "tell me", true},
		{"responses items", `{"input":[{"role":"user","content":[{"type":"input_text","text":"Q"}]},{"type":"message","role":"assistant","content":"A"}]}`, "user|Q|assistant|A|", true},
		{"escapes kept raw", `{"prompt":"a\"b\\"}`, `a\"b\\`, true},
		{"no prompt", `{"model":"x"}`, "", false},
		{"garbage", `]]]`, "", false},
		{"truncated mid string", `{"messages":[{"role":"user","content":"abcdef`, "user|abcdef|", true},
		{"truncated mid escape", `{"prompt":"ab\`, "ab", true},
		{"deep nesting skipped", `{"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `,"prompt":"p"}`, "p", true},
		{"invalid utf8", "{\"prompt\":\"\xff\xfe\"}", "\xff\xfe", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r recSink
			found := walkPrompt([]byte(tc.body), &r)
			if found != tc.found || r.b.String() != tc.want {
				t.Fatalf("walkPrompt = %q found=%v, want %q found=%v", r.b.String(), found, tc.want, tc.found)
			}
		})
	}
}

func TestWalkPromptHugeBody(t *testing.T) {
	big := strings.Repeat("word ", 2<<20) // 10 MB
	body := `{"model":"m","messages":[{"role":"user","content":"` + big + `"}]}`
	var r recSink
	if !walkPrompt([]byte(body), &r) || r.b.Len() != len(big)+len("user||") {
		t.Fatalf("huge body: got %d bytes", r.b.Len())
	}
	if string(findModel([]byte(body))) != "m" {
		t.Fatal("model lost in huge body")
	}
}

func TestPrefixHasherSharedPrefix(t *testing.T) {
	var h1, h2 prefixHasher
	sys := strings.Repeat("You are a helpful assistant. ", 40)
	h1.reset(64, make([]uint64, 0, 128))
	walkPrompt([]byte(chatBody("m", sys, strings.Repeat("first question ", 20))), &h1)
	h2.reset(64, make([]uint64, 0, 128))
	walkPrompt([]byte(chatBody("m", sys, strings.Repeat("another one entirely ", 20))), &h2)
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

func FuzzPayload(f *testing.F) {
	for _, s := range []string{
		`{"model":"x","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"prompt":[[1,2],[3]]}`, `{"input":"x"}`, `{"model":"a\"b"}`, `[`, `{"a":"\`, "{\"prompt\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = findModel(b)
		_ = hasKey(b, "kv_transfer_params")
		var h prefixHasher
		h.reset(16, make([]uint64, 0, 64))
		walkPrompt(b, &h)
		// Every text piece must be a view into the body, in increasing order.
		c := &viewSink{body: b, t: t}
		walkPrompt(b, c)
	})
}

// Blocks hashed in place and blocks assembled across pieces must agree, or
// the same prompt would hash differently depending on its JSON layout.
func TestPrefixHasherPieces(t *testing.T) {
	text := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40))
	var whole prefixHasher
	whole.reset(64, make([]uint64, 0, 64))
	whole.text(text)
	for _, cut := range []int{1, 7, 63, 64, 65, 200} {
		var h prefixHasher
		h.reset(64, make([]uint64, 0, 64))
		for p := text; len(p) > 0; {
			n := min(cut, len(p))
			h.text(p[:n])
			p = p[n:]
		}
		if fmt.Sprint(h.out) != fmt.Sprint(whole.out) || h.total != whole.total {
			t.Fatalf("pieces of %d hash differently", cut)
		}
	}
}
