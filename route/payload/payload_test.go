package payload

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

func (v *viewSink) Text(p []byte) {
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
func (v *viewSink) Sep(byte)     {}
func (v *viewSink) Token(uint32) {}

// recSink records the prompt stream for assertions.
type recSink struct{ b bytes.Buffer }

func (r *recSink) Text(p []byte)   { r.b.Write(p) }
func (r *recSink) Sep(c byte)      { r.b.WriteByte('|') }
func (r *recSink) Token(id uint32) { fmt.Fprintf(&r.b, "<%d>", id) }

// byteSink records the stream exactly as a hasher sees it: separator
// bytes as they are, token ids as 4 little-endian bytes.
type byteSink struct{ b []byte }

func (r *byteSink) Text(p []byte) { r.b = append(r.b, p...) }
func (r *byteSink) Sep(c byte)    { r.b = append(r.b, c) }
func (r *byteSink) Token(id uint32) {
	r.b = append(r.b, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
}
func (r *byteSink) text(p []byte)  { r.Text(p) }
func (r *byteSink) sep(c byte)     { r.Sep(c) }
func (r *byteSink) token(id int64) { r.Token(uint32(id)) }

// refRec adapts recSink to the reference walker's sink.
type refRec struct{ recSink }

func (r *refRec) text(p []byte)  { r.Text(p) }
func (r *refRec) sep(c byte)     { r.Sep(c) }
func (r *refRec) token(id int64) { r.Token(uint32(id)) }

func index(body string) *Index {
	var x Index
	x.Build([]byte(body), false)
	return &x
}

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
			if got := string(index(tc.body).ModelRaw()); got != tc.want {
				t.Fatalf("ModelRaw = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPrompt(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		found            bool
	}{
		{"chat string", `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}`, "system|S|user|U|", true},
		{"chat parts skip image", `{"messages":[{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"B"}]}]}`, "user|AB|", true},
		{"chat null content", `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`, "assistant||", true},
		{"prompt string", `{"prompt":"hello world"}`, "hello world", true},
		{"prompt strings", `{"prompt":["a","b"]}`, "a|b|", true},
		{"prompt tokens", `{"prompt":[1,2,-3]}`, "<1><2><4294967293>", true},
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
			found := index(tc.body).Prompt(&r)
			if found != tc.found || r.b.String() != tc.want {
				t.Fatalf("Prompt = %q found=%v, want %q found=%v", r.b.String(), found, tc.want, tc.found)
			}
		})
	}
}

func TestPromptHugeBody(t *testing.T) {
	big := strings.Repeat("word ", 2<<20) // 10 MB
	body := `{"model":"m","messages":[{"role":"user","content":"` + big + `"}]}`
	var r recSink
	x := index(body)
	if !x.Prompt(&r) || r.b.Len() != len(big)+len("user||") {
		t.Fatalf("huge body: got %d bytes", r.b.Len())
	}
	if string(x.ModelRaw()) != "m" {
		t.Fatal("model lost in huge body")
	}
}
