package bench

import (
	"strconv"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/fleet"
)

// wordLen is the length of a chunk word. Five letters give 26^5 (11.9M)
// distinct words, so unrelated chunks practically never share a 16-token
// cache block, while a 15k-token prompt stays near 90 KiB of JSON.
const wordLen = 5

// chunkWord writes word j of the chunk named id into w. The word depends only
// on (id, j): a hash id always expands to the same 512 words, so shared ids
// give byte-identical prefixes, and different ids give different text.
func chunkWord(w *[wordLen]byte, id uint64, j int) {
	x := fleet.Mix64(id*BlockTokens + uint64(j) + 0x7475726e6f7574) // "turnout"
	for k := range w {
		w[k] = 'a' + byte(x%26)
		x /= 26
	}
}

// AppendPromptText appends the prompt's words separated by single spaces:
// chunk after chunk, cut at InputTokens words.
func AppendPromptText(dst []byte, r *Request) []byte {
	var w [wordLen]byte
	n := 0
	for _, id := range r.HashIDs {
		for j := 0; j < BlockTokens && n < r.InputTokens; j++ {
			if n > 0 {
				dst = append(dst, ' ')
			}
			chunkWord(&w, id, j)
			dst = append(dst, w[:]...)
			n++
		}
	}
	return dst
}

// userRole is the only chat role the replay sends.
const userRole = "user"

// AppendPromptTokens appends the tokens a mock replica derives from the chat
// body AppendChatBody builds (mock.ChatPromptTokens), without building or
// parsing the body: the role token, then one token per word.
func AppendPromptTokens(dst []int32, r *Request) []int32 {
	dst = append(dst, mock.RoleToken(userRole))
	var w [wordLen]byte
	n := 0
	for _, id := range r.HashIDs {
		for j := 0; j < BlockTokens && n < r.InputTokens; j++ {
			chunkWord(&w, id, j)
			dst = append(dst, wordToken(&w))
			n++
		}
	}
	return dst
}

// wordToken is mock.TokenID for a chunk word, without a string.
func wordToken(w *[wordLen]byte) int32 {
	h := uint32(2166136261)
	for _, c := range w {
		h ^= uint32(c)
		h *= 16777619
	}
	return int32(h & 0x7fffffff)
}

// PromptTokens is the number of tokens the replica counts for r.
func PromptTokens(r *Request) int { return r.InputTokens + 1 }

// BodyOptions shape the chat request body.
type BodyOptions struct {
	Model  string
	Stream bool
}

// AppendChatBody appends an OpenAI chat completions body for r. The words
// are plain letters, so the prompt needs no JSON escaping.
func AppendChatBody(dst []byte, r *Request, o BodyOptions) []byte {
	dst = append(dst, `{"model":`...)
	dst = strconv.AppendQuote(dst, o.Model)
	dst = append(dst, `,"messages":[{"role":"`+userRole+`","content":"`...)
	dst = AppendPromptText(dst, r)
	dst = append(dst, `"}],"max_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.OutputTokens), 10)
	if o.Stream {
		dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	return append(dst, '}')
}
