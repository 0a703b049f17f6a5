package route

import (
	"fmt"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/payload"
)

// TestOneBodyScan: whatever a request needs -- the model, prefix hashes for
// several pools, token ids, the tokenizer's input, the PD checks and the
// prefill body -- the body is scanned once, through the real handler. The
// Index counts its passes; the rest of route has no scanner of its own
// (it reads the body only through the Index).
func TestOneBodyScan(t *testing.T) {
	pa, pb := startFakePrefill(t), startFakePrefill(t)
	tokAddr, tokCalls := fakeTokenizer(t)
	chat := chatBody("llama", strings.Repeat("You are a helpful assistant. ", 40), "what is a turnout?")
	toks := tokBody(seqToks(256, 5))

	newKV := func(params string) *Decider { s, _ := kvServer(t, params); return s }
	for _, tc := range []struct {
		name   string
		s      *Decider
		body   string
		status int
		// prompt: whether the handler had the prompt replayed for hashing
		check func(t *testing.T, x *payload.Index)
	}{
		{"prefix-affinity", mustServer(t, fmt.Sprintf(fourEndpoints, "prefix-affinity")), chat, 200, nil},
		{"pd prefill and decode", pdServer(t, "", pa, pb), chat, 200, func(t *testing.T, x *payload.Index) {
			if !x.Object() || x.Has(payload.KVTransferKey) || string(x.Value("stream")) != "true" {
				t.Fatalf("index: object %v kv %v stream %q", x.Object(), x.Has(payload.KVTransferKey), x.Value("stream"))
			}
		}},
		{"pd client kv refused", pdServer(t, "", pa, pb), `{"model":"llama","prompt":"x","kv_transfer_params":{}}`, 400, nil},
		{"kv-aware remote tokenizer", newKV("block_size: 4, tokenizer: {mode: remote, address: '" + tokAddr + "'}"), chat, 200, nil},
		{"kv-aware token ids", newKV("block_size: 16, tokenizer: {mode: none}"), toks, 200, func(t *testing.T, x *payload.Index) {
			if ids, ok := x.TokenIDs(); !ok || len(ids) != 256 {
				t.Fatalf("token ids %d %v", len(ids), ok)
			}
		}},
		{"kv-aware fallback hashing", newKV("block_size: 16, tokenizer: {mode: none}"), chat, 200, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := 0
			tc.s.txns.observe = func(r *fleet.Request) {
				seen++
				if n := r.Payload.Scans(); n != 1 {
					t.Errorf("body scanned %d times, want 1", n)
				}
				if string(r.Payload.Model()) != "llama" {
					t.Errorf("model %q", r.Payload.Model())
				}
				if tc.check != nil {
					tc.check(t, r.Payload)
				}
			}
			ctx := do(tc.s, tc.body, contract.HdrOriginalURI, "/v1/chat/completions")
			if ctx.Response.StatusCode() != tc.status {
				t.Fatalf("status %d, want %d: %s", ctx.Response.StatusCode(), tc.status, ctx.Response.Body())
			}
			if seen != 1 {
				t.Fatalf("observed %d requests, want 1", seen)
			}
		})
	}
	if tokCalls.Load() != 1 {
		t.Fatalf("tokenizer called %d times, want 1 (the remote case)", tokCalls.Load())
	}
	if pa.calls.Load()+pb.calls.Load() != 1 {
		t.Fatalf("prefill called %d times, want 1", pa.calls.Load()+pb.calls.Load())
	}
}
