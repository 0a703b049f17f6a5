package mock

import (
	"errors"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
)

func refTokenID(w string) int32 {
	h := fnv.New32a()
	h.Write([]byte(w))
	return int32(h.Sum32() & 0x7fffffff)
}

func ids(words ...string) []int32 {
	out := make([]int32, len(words))
	for i, w := range words {
		out[i] = refTokenID(w)
	}
	return out
}

func TestTokenIDMatchesFNV32a(t *testing.T) {
	for _, w := range []string{"", "a", "hello", "<|user|>", "日本語", "tok123"} {
		if got, want := TokenID(w), refTokenID(w); got != want {
			t.Errorf("TokenID(%q) = %d, want %d", w, got, want)
		}
		if TokenID(w) < 0 {
			t.Errorf("TokenID(%q) negative", w)
		}
	}
	if RoleToken("user") != TokenID("<|user|>") {
		t.Error("RoleToken(user) != TokenID(<|user|>)")
	}
}

func TestTokenizeSplitsLikeFields(t *testing.T) {
	for _, text := range []string{
		"", "   ", "a", " hello  world ", "a\tb\nc\r\nd\v\fe",
		"non\u00a0breaking", "ideo\u3000space", "ünïcödé wörds", "x\u2028y",
	} {
		want := ids(strings.Fields(text)...)
		if got := Tokenize(text); !slices.Equal(got, want) {
			t.Errorf("Tokenize(%q) = %v, want %v", text, got, want)
		}
	}
}

func TestChatPromptTokens(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []int32
		wantErr bool
	}{
		{
			name: "string contents",
			body: `{"model":"m","messages":[{"role":"system","content":"be nice"},{"role":"user","content":"hi  there"}]}`,
			want: ids("<|system|>", "be", "nice", "<|user|>", "hi", "there"),
		},
		{
			name: "parts with image skipped",
			body: `{"messages":[{"role":"user","content":[{"type":"text","text":"look at"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"this"}]}]}`,
			want: ids("<|user|>", "look", "at", "this"),
		},
		{
			name: "null content keeps the role marker",
			body: `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[]},{"role":"tool","content":"r"}]}`,
			want: ids("<|user|>", "q", "<|assistant|>", "<|tool|>", "r"),
		},
		{
			name: "empty parts array",
			body: `{"messages":[{"role":"user","content":[]}]}`,
			want: ids("<|user|>"),
		},
		{name: "numeric content", body: `{"messages":[{"role":"user","content":5}]}`, wantErr: true},
		{name: "part not an object", body: `{"messages":[{"role":"user","content":["x"]}]}`, wantErr: true},
		{name: "no messages", body: `{"model":"m"}`, wantErr: true},
		{name: "empty messages", body: `{"messages":[]}`, wantErr: true},
		{name: "bad json", body: `{"messages":[`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChatPromptTokens([]byte(tc.body))
			if tc.wantErr {
				if err == nil {
					t.Fatalf("want error, got %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			// Deterministic across calls.
			again, _ := ChatPromptTokens([]byte(tc.body))
			if !slices.Equal(got, again) {
				t.Fatal("not deterministic")
			}
		})
	}
}

func TestCompletionPromptShapes(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    [][]int32
		wantErr bool
	}{
		{name: "string", body: `{"prompt":"a b c"}`, want: [][]int32{ids("a", "b", "c")}},
		{name: "escaped string", body: `{"prompt":"a\nb \u0063"}`, want: [][]int32{ids("a", "b", "c")}},
		{name: "array of strings", body: `{"prompt":["a b", "c"]}`, want: [][]int32{ids("a", "b"), ids("c")}},
		{name: "token ids", body: `{"prompt":[1, 2, 3]}`, want: [][]int32{{1, 2, 3}}},
		{name: "array of token id arrays", body: `{"prompt":[ [1,2],[3] ]}`, want: [][]int32{{1, 2}, {3}}},
		{name: "empty string", body: `{"prompt":""}`, want: [][]int32{{}}},
		{name: "missing", body: `{}`, wantErr: true},
		{name: "null", body: `{"prompt":null}`, wantErr: true},
		{name: "empty array", body: `{"prompt":[]}`, wantErr: true},
		{name: "number", body: `{"prompt":7}`, wantErr: true},
		{name: "mixed array", body: `{"prompt":[1,"a"]}`, wantErr: true},
		{name: "float ids", body: `{"prompt":[1.5]}`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CompletionPromptTokens([]byte(tc.body))
			if tc.wantErr {
				if err == nil {
					t.Fatalf("want error, got %v", got)
				}
				if !errors.Is(err, ErrBadPrompt) {
					t.Fatalf("error %v does not wrap ErrBadPrompt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d prompts, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if !slices.Equal(got[i], tc.want[i]) {
					t.Fatalf("prompt %d: got %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestPromptTokensByPath(t *testing.T) {
	chat, err := PromptTokens(PathChat, []byte(`{"messages":[{"role":"user","content":"x y"}]}`))
	if err != nil || !slices.Equal(chat, ids("<|user|>", "x", "y")) {
		t.Fatalf("chat: %v %v", chat, err)
	}
	comp, err := PromptTokens(PathCompletions, []byte(`{"prompt":["x y","z"]}`))
	if err != nil || !slices.Equal(comp, ids("x", "y")) {
		t.Fatalf("completions: %v %v", comp, err)
	}
}

func TestGeneratedText(t *testing.T) {
	if got := GeneratedText(3); got != "tok1 tok2 tok3" {
		t.Fatalf("GeneratedText(3) = %q", got)
	}
}
