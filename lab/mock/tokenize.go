package mock

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/bytedance/sonic"
)

// jsonAPI is sonic's default config: strings may alias the input buffer, which
// is fine because decoded requests never outlive the handler's body buffer
// (anything kept longer is cloned explicitly).
var jsonAPI = sonic.ConfigDefault

// TokenID maps a word to a deterministic token id: FNV-1a 32 masked to 31
// bits, so ids are non-negative int32 like real vocabulary ids.
func TokenID(word string) int32 {
	h := uint32(2166136261)
	for i := 0; i < len(word); i++ {
		h ^= uint32(word[i])
		h *= 16777619
	}
	return int32(h & 0x7fffffff)
}

// roleTokenID is TokenID("<|"+role+"|>") without building the string.
func roleTokenID(role string) int32 {
	h := uint32(2166136261)
	for _, part := range [3]string{"<|", role, "|>"} {
		for i := 0; i < len(part); i++ {
			h ^= uint32(part[i])
			h *= 16777619
		}
	}
	return int32(h & 0x7fffffff)
}

// RoleToken is the token the chat template emits before each message.
func RoleToken(role string) int32 { return roleTokenID(role) }

// Tokenize splits text into words exactly like strings.Fields and maps each
// word through TokenID.
func Tokenize(text string) []int32 { return AppendTokens(nil, text) }

// asciiSpace mirrors strings.Fields' ASCII whitespace set.
var asciiSpace = [256]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// AppendTokens appends the tokens of text to dst without allocating per word.
func AppendTokens(dst []int32, text string) []int32 {
	i, n := 0, len(text)
	for i < n {
		for i < n {
			c := text[i]
			if c < utf8.RuneSelf {
				if !asciiSpace[c] {
					break
				}
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(text[i:])
			if !unicode.IsSpace(r) {
				break
			}
			i += size
		}
		start := i
		for i < n {
			c := text[i]
			if c < utf8.RuneSelf {
				if asciiSpace[c] {
					break
				}
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(text[i:])
			if unicode.IsSpace(r) {
				break
			}
			i += size
		}
		if i > start {
			dst = append(dst, TokenID(text[start:i]))
		}
	}
	return dst
}

// ErrBadPrompt is wrapped by every prompt/template error so callers can map it
// to a 400.
var ErrBadPrompt = errors.New("invalid prompt")

// chatMessage keeps content as `any` because it is either a string (cheap
// path: sonic decodes it straight to a string) or an array of parts.
type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// apiRequest is the union of the chat, completions and tokenize request
// fields the mock looks at; everything else is ignored like vLLM ignores
// sampling knobs it does not need here.
type apiRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
}

// appendChatTokens applies the fixed chat template: for each message the
// token of "<|ROLE|>" followed by the words of its text content. Non-text
// parts (images, audio, ...) are skipped.
func appendChatTokens(dst []int32, msgs []chatMessage) ([]int32, error) {
	for i := range msgs {
		m := &msgs[i]
		dst = append(dst, roleTokenID(m.Role))
		switch c := m.Content.(type) {
		case nil:
			// e.g. an assistant message that only carries tool_calls.
		case string:
			dst = AppendTokens(dst, c)
		case []any:
			for _, p := range c {
				part, ok := p.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("messages[%d].content: part is not an object: %w", i, ErrBadPrompt)
				}
				if t, _ := part["type"].(string); t != "text" {
					continue
				}
				text, _ := part["text"].(string)
				dst = AppendTokens(dst, text)
			}
		default:
			return nil, fmt.Errorf("messages[%d].content must be a string or an array of parts: %w", i, ErrBadPrompt)
		}
	}
	return dst, nil
}

func (r *apiRequest) chatTokens() ([]int32, error) {
	return r.appendChatTokens(make([]int32, 0, 64))
}

func (r *apiRequest) appendChatTokens(dst []int32) ([]int32, error) {
	if len(r.Messages) == 0 {
		return nil, fmt.Errorf("messages must be a non-empty array: %w", ErrBadPrompt)
	}
	return appendChatTokens(dst, r.Messages)
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// completionTokens decodes the completions `prompt` in any of its four
// shapes; a list of strings or of token lists is a batch (one entry each).
func (r *apiRequest) completionTokens() ([][]int32, error) {
	raw := skipSpace(r.Prompt)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("prompt is required: %w", ErrBadPrompt)
	}
	switch raw[0] {
	case '"':
		var s string
		if err := jsonAPI.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("prompt: %v: %w", err, ErrBadPrompt)
		}
		return [][]int32{Tokenize(s)}, nil
	case '[':
		inner := skipSpace(raw[1:])
		if len(inner) == 0 || inner[0] == ']' {
			return nil, fmt.Errorf("prompt must not be an empty array: %w", ErrBadPrompt)
		}
		switch inner[0] {
		case '"':
			var ss []string
			if err := jsonAPI.Unmarshal(raw, &ss); err != nil {
				return nil, fmt.Errorf("prompt: %v: %w", err, ErrBadPrompt)
			}
			out := make([][]int32, len(ss))
			for i, s := range ss {
				out[i] = Tokenize(s)
			}
			return out, nil
		case '[':
			var tt [][]int32
			if err := jsonAPI.Unmarshal(raw, &tt); err != nil {
				return nil, fmt.Errorf("prompt: %v: %w", err, ErrBadPrompt)
			}
			return tt, nil
		default:
			var t []int32
			if err := jsonAPI.Unmarshal(raw, &t); err != nil {
				return nil, fmt.Errorf("prompt: %v: %w", err, ErrBadPrompt)
			}
			return [][]int32{t}, nil
		}
	default:
		return nil, fmt.Errorf("prompt must be a string, an array of strings, an array of token ids or an array of token id arrays: %w", ErrBadPrompt)
	}
}

func parseRequest(body []byte) (*apiRequest, error) {
	var r apiRequest
	if err := jsonAPI.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("invalid JSON body: %w", err)
	}
	return &r, nil
}

// ChatPromptTokens returns the prompt tokens of a /v1/chat/completions body,
// exactly as the replica's prefix cache sees them.
func ChatPromptTokens(body []byte) ([]int32, error) {
	r, err := parseRequest(body)
	if err != nil {
		return nil, err
	}
	return r.chatTokens()
}

// CompletionPromptTokens returns the prompt tokens of a /v1/completions body:
// one slice per prompt (a batch has several).
func CompletionPromptTokens(body []byte) ([][]int32, error) {
	r, err := parseRequest(body)
	if err != nil {
		return nil, err
	}
	return r.completionTokens()
}

// PromptTokens returns the prompt tokens for a request to path: the chat
// template for "/v1/chat/completions", otherwise the completions prompt (the
// first prompt of a batch, which is what a router keys on).
func PromptTokens(path string, body []byte) ([]int32, error) {
	if path == PathChat {
		return ChatPromptTokens(body)
	}
	ps, err := CompletionPromptTokens(body)
	if err != nil {
		return nil, err
	}
	return ps[0], nil
}

// GeneratedText is the deterministic completion text for n tokens:
// "tok1 tok2 ... tokN".
func GeneratedText(n int) string { return string(appendGeneratedText(nil, n)) }

func appendGeneratedText(b []byte, n int) []byte {
	for i := 1; i <= n; i++ {
		if i > 1 {
			b = append(b, ' ')
		}
		b = appendTokenWord(b, i)
	}
	return b
}

func appendTokenWord(b []byte, i int) []byte {
	b = append(b, "tok"...)
	return appendInt(b, int64(i))
}
