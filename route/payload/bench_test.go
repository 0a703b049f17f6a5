package payload

import (
	"fmt"
	"strings"
	"testing"
)

// lenSink consumes a prompt without hashing it, so the benchmarks below
// measure reading the body, not the hasher.
type lenSink struct{ n int }

func (s *lenSink) Text(p []byte) { s.n += len(p) }
func (s *lenSink) Sep(byte)      { s.n++ }
func (s *lenSink) Token(uint32)  { s.n += 4 }
func (s *lenSink) text(p []byte) { s.Text(p) }
func (s *lenSink) sep(b byte)    { s.Sep(b) }
func (s *lenSink) token(v int64) { s.Token(uint32(v)) }

// BenchmarkBodyReads compares, per kind of decision, the one pass of the
// Index with the per-question scans it replaced (reference_test.go), on
// the bodies of route's decision benchmarks: a 4 KiB chat body, a
// 1024-token token-id prompt.
func BenchmarkBodyReads(b *testing.B) {
	for _, tc := range bodyReadCases() {
		for _, impl := range []struct {
			name string
			fn   func([]byte)
		}{{"reference", tc.reference}, {"index", tc.index}} {
			b.Run(tc.name+"/"+impl.name, func(b *testing.B) {
				impl.fn(tc.body)
				b.SetBytes(int64(len(tc.body)))
				b.ReportAllocs()
				for b.Loop() {
					impl.fn(tc.body)
				}
			})
		}
	}
}

type bodyReadCase struct {
	name             string
	body             []byte
	reference, index func(body []byte)
}

func bodyReadCases() []bodyReadCase {
	sys := strings.Repeat("You are a helpful assistant that answers precisely. ", 80)[:3500]
	chat := []byte(fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"stream":true}`, sys, "What is the capital of country number 7?"))
	var tb strings.Builder
	tb.WriteString(`{"model":"llama","prompt":[`)
	for i := 0; i < 1024; i++ {
		if i > 0 {
			tb.WriteByte(',')
		}
		fmt.Fprint(&tb, 7+i)
	}
	tb.WriteString(`]}`)
	toks := []byte(tb.String())

	var x Index
	var sink lenSink
	var ids []int64
	return []bodyReadCase{
		{"model only (least-request...)", chat,
			func(body []byte) { _ = refFindModel(body) },
			func(body []byte) { x.Reset(); x.Build(body, false); _ = x.Model() }},
		{"prompt (prefix-affinity)", chat,
			func(body []byte) { _ = refFindModel(body); refWalkPrompt(body, &sink) },
			func(body []byte) { x.Reset(); x.Build(body, false); x.Prompt(&sink) }},
		{"token ids (kv-aware)", toks,
			func(body []byte) { _ = refFindModel(body); ids, _ = refTokenPrompt(body, ids[:0]) },
			func(body []byte) { x.Reset(); x.Build(body, false); _, _ = x.TokenIDs() }},
		{"prefill/decode, prompt hashed for both pools", chat,
			func(body []byte) {
				_ = refFindModel(body)
				_, _ = refIsObject(body), refHasKey(body, KVTransferKey)
				refWalkPrompt(body, &sink)
				refWalkPrompt(body, &sink)
				_, _ = refPrefillBody(body)
			},
			func(body []byte) {
				x.Reset()
				x.Build(body, false)
				_, _ = x.Object(), x.Has(KVTransferKey)
				x.Prompt(&sink)
				x.Prompt(&sink)
				_, _ = PrefillBody(&x)
			}},
	}
}
