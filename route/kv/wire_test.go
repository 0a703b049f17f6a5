package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// enc builds a fixture by hand: nested []any / map[string]any trees encoded
// with msgpack, compact ints like msgspec or fixed-width ones.
func enc(t testing.TB, v any, compact bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(compact)
	if err := e.Encode(v); err != nil {
		t.Fatalf("encode fixture: %v", err)
	}
	return buf.Bytes()
}

func sha(h uint64) []byte {
	b := bytes.Repeat([]byte{0xab}, 32) // non-zero prefix: only the low 8 bytes count
	binary.BigEndian.PutUint64(b[24:], h)
	return b
}

type arr = []any
type obj = map[string]any

func TestDecodeBatch(t *testing.T) {
	const big = uint64(1)<<63 + 5
	tests := []struct {
		name string
		in   any
		want Batch
	}{
		{
			name: "oldest vLLM: 5-field BlockStored, no dp rank",
			in:   arr{1.5, arr{arr{"BlockStored", arr{uint64(11), uint64(12)}, nil, arr{1, 2, 3, 4}, 2, nil}}},
			want: Batch{TS: 1.5, Events: []Event{{Kind: EventBlockStored, BlockHashes: []uint64{11, 12}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2}}},
		},
		{
			name: "required fields only",
			in:   arr{1.0, arr{arr{"BlockStored", arr{7}, 6, arr{9}, 1}}},
			want: Batch{TS: 1, Events: []Event{{Kind: EventBlockStored, BlockHashes: []uint64{7}, ParentHash: 6, HasParent: true, TokenIDs: []uint32{9}, BlockSize: 1}}},
		},
		{
			name: "medium, lora_name and dp rank",
			in:   arr{2.0, arr{arr{"BlockStored", arr{1}, 5, arr{10, 20}, 2, 3, "GPU", "adapter"}}, 1},
			want: Batch{TS: 2, DPRank: 1, HasDPRank: true, Events: []Event{{
				Kind: EventBlockStored, BlockHashes: []uint64{1}, ParentHash: 5, HasParent: true, TokenIDs: []uint32{10, 20},
				BlockSize: 2, LoraID: 3, HasLoraID: true, LoraName: "adapter", Medium: "GPU",
			}}},
		},
		{
			name: "newest layout plus unknown trailing fields",
			in: arr{3.0, arr{arr{"BlockStored", arr{1, 2}, nil, arr{1, 2}, 1, nil, "GPU", nil,
				arr{nil, arr{"mm-hash", 0}}, 0, "full_attention", nil, obj{"future": arr{1, 2}}}}, 0, "future-batch-field"},
			want: Batch{TS: 3, HasDPRank: true, Events: []Event{{
				Kind: EventBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2}, BlockSize: 1,
				Medium: "GPU", ExtraKeys: []bool{false, true}, HasGroup: true, SpecKind: "full_attention",
			}}},
		},
		{
			name: "int hashes: above int64, max uint64, negative int64",
			in:   arr{0.0, arr{arr{"BlockRemoved", arr{big, uint64(math.MaxUint64), int64(-1), int64(-12345), int8(-3)}}}},
			want: Batch{Events: []Event{{Kind: EventBlockRemoved, BlockHashes: []uint64{big, math.MaxUint64, math.MaxUint64,
				uint64(math.MaxUint64 - 12344), uint64(math.MaxUint64 - 2)}}}},
		},
		{
			name: "bytes hashes take the low 64 bits big-endian",
			in:   arr{0.0, arr{arr{"BlockStored", arr{sha(42), []byte{1, 2, 3}}, sha(41), arr{1, 2}, 1, nil, "GPU", nil}}},
			want: Batch{Events: []Event{{Kind: EventBlockStored, BlockHashes: []uint64{42, 0x010203}, ParentHash: 41, HasParent: true,
				TokenIDs: []uint32{1, 2}, BlockSize: 1, Medium: "GPU"}}},
		},
		{
			name: "BlockRemoved old and new, AllBlocksCleared with extras",
			in:   arr{0.25, arr{arr{"BlockRemoved", arr{1}}, arr{"BlockRemoved", arr{2}, "CPU", 1, "extra"}, arr{"AllBlocksCleared"}, arr{"AllBlocksCleared", "x"}}, nil},
			want: Batch{TS: 0.25, Events: []Event{
				{Kind: EventBlockRemoved, BlockHashes: []uint64{1}},
				{Kind: EventBlockRemoved, BlockHashes: []uint64{2}, Medium: "CPU", GroupIdx: 1, HasGroup: true},
				{Kind: EventAllBlocksCleared}, {Kind: EventAllBlocksCleared},
			}},
		},
		{
			name: "unknown event tag is skipped",
			in:   arr{1.0, arr{arr{"BlockUpdated", 1, arr{2}}, arr{"AllBlocksCleared"}}, 0},
			want: Batch{TS: 1, HasDPRank: true, Skipped: 1, Events: []Event{{Kind: EventAllBlocksCleared}}},
		},
		{
			name: "integer ts, empty events",
			in:   arr{17, arr{}},
			want: Batch{TS: 17, Events: []Event{}},
		},
		{
			name: "map events (vLLM #42892) with tag not first and unknown keys",
			in: arr{1.0, arr{
				obj{"block_hashes": arr{sha(9)}, "type": "BlockStored", "parent_block_hash": nil, "token_ids": arr{5, 6}, "block_size": 2,
					"lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": arr{nil}, "group_idx": 0, "kv_cache_spec_kind": "full_attention", "new": obj{"a": 1}},
				obj{"type": "BlockRemoved", "block_hashes": arr{9}, "medium": "GPU", "token_ids": arr{1}},
				obj{"type": "AllBlocksCleared"},
			}, 0},
			want: Batch{TS: 1, HasDPRank: true, Events: []Event{
				{Kind: EventBlockStored, BlockHashes: []uint64{9}, TokenIDs: []uint32{5, 6}, BlockSize: 2, Medium: "GPU", ExtraKeys: []bool{false}, HasGroup: true, SpecKind: "full_attention"},
				{Kind: EventBlockRemoved, BlockHashes: []uint64{9}, Medium: "GPU"},
				{Kind: EventAllBlocksCleared},
			}},
		},
		{
			name: "map batch",
			in:   obj{"ts": 4.5, "events": arr{obj{"type": "BlockRemoved", "block_hashes": arr{3}}}, "data_parallel_rank": 2, "later": true},
			want: Batch{TS: 4.5, DPRank: 2, HasDPRank: true, Events: []Event{{Kind: EventBlockRemoved, BlockHashes: []uint64{3}}}},
		},
	}
	for _, tc := range tests {
		for _, compact := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/compact=%v", tc.name, compact), func(t *testing.T) {
				got, err := DecodeBatch(enc(t, tc.in, compact))
				if err != nil {
					t.Fatalf("DecodeBatch: %v", err)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("got  %+v\nwant %+v", got, tc.want)
				}
			})
		}
	}
}

func TestDecodeBatchErrors(t *testing.T) {
	deep := any(1)
	for range 40 {
		deep = arr{deep}
	}
	tests := []struct {
		name string
		raw  []byte
		in   any
	}{
		{name: "empty", raw: []byte{}},
		{name: "garbage", raw: []byte{0xc1, 0xff, 0x00}},
		{name: "not an array", in: "hello"},
		{name: "batch too short", in: arr{1.0}},
		{name: "ts nil", in: arr{nil, arr{}}},
		{name: "ts string", in: arr{"x", arr{}}},
		{name: "events not a list", in: arr{1.0, obj{"a": 1}}},
		{name: "events nil", in: arr{1.0, nil}},
		{name: "dp rank string", in: arr{1.0, arr{}, "0"}},
		{name: "map batch without events", in: obj{"ts": 1.0}},
		{name: "map key not string", in: map[int]any{1: 2}},
		{name: "too deep unknown field", in: arr{1.0, arr{arr{"AllBlocksCleared", deep}}}},
		{name: "array header longer than input", raw: []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{name: "bytes header longer than input", raw: []byte{0x92, 0x00, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xc6, 0x7f, 0xff, 0xff, 0xff}},
		{name: "trailing bytes", raw: append(enc(t, arr{1.0, arr{}}, true), 0x00)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.raw
			if raw == nil {
				raw = enc(t, tc.in, true)
			}
			_, err := DecodeBatch(raw)
			if err == nil {
				t.Fatalf("DecodeBatch(%x) succeeded, want error", raw)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func sampleBatch() Batch {
	return Batch{TS: 1712345678.125, DPRank: 3, HasDPRank: true, Events: []Event{
		{Kind: EventBlockStored, BlockHashes: []uint64{1, math.MaxUint64, 1 << 63}, TokenIDs: []uint32{1, 1 << 31, 3, 4, 5, math.MaxUint32}, BlockSize: 2, Medium: "GPU"},
		{Kind: EventBlockStored, BlockHashes: []uint64{99}, ParentHash: 1 << 63, HasParent: true, TokenIDs: []uint32{7, 8}, BlockSize: 2,
			LoraID: 4, HasLoraID: true, LoraName: "l", ExtraKeys: []bool{true}, GroupIdx: 1, HasGroup: true},
		{Kind: EventBlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{7, 8}, BlockSize: 2, HasGroup: true},
		{Kind: EventBlockStored, BlockHashes: []uint64{6}, TokenIDs: []uint32{7, 8}, BlockSize: 2, SpecKind: "sliding_window"},
		{Kind: EventBlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{7, 8}, BlockSize: 2, ExtraKeys: []bool{}, SpecKind: "mamba"},
		{Kind: EventBlockRemoved, BlockHashes: []uint64{99, 1}, Medium: "CPU"},
		{Kind: EventBlockRemoved, BlockHashes: []uint64{}, GroupIdx: 2, HasGroup: true},
		{Kind: EventAllBlocksCleared},
	}}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	batches := map[string]Batch{
		"sample":     sampleBatch(),
		"empty":      {TS: 0, Events: []Event{}},
		"no dp rank": {TS: 2, Events: []Event{{Kind: EventAllBlocksCleared}}},
	}
	for name, b := range batches {
		for _, o := range []EncodeOptions{{}, {HashAsBytes: true}, {MapEvents: true}, {MapEvents: true, MapBatch: true, HashAsBytes: true}} {
			raw, err := EncodeBatchWith(b, o)
			if err != nil {
				t.Fatalf("%s %+v: encode: %v", name, o, err)
			}
			got, err := DecodeBatch(raw)
			if err != nil {
				t.Fatalf("%s %+v: decode: %v", name, o, err)
			}
			if !reflect.DeepEqual(got, b) {
				t.Fatalf("%s %+v: round trip\ngot  %+v\nwant %+v", name, o, got, b)
			}
		}
	}
}

// TestEncodeBatchLayout pins the legacy bytes to what msgspec emits for
// EventBatch(ts=1.5, events=[BlockStored([1], None, [1, 2], 2, None, "GPU", None)], data_parallel_rank=0).
func TestEncodeBatchLayout(t *testing.T) {
	b := Batch{TS: 1.5, HasDPRank: true, Events: []Event{{Kind: EventBlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"}}}
	got, err := EncodeBatch(b, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x98, 0xab}
	want = append(want, "BlockStored"...)
	want = append(want, 0x91, 0x01, 0xc0, 0x92, 0x01, 0x02, 0x02, 0xc0, 0xa3, 'G', 'P', 'U', 0xc0, 0x00)
	if !bytes.Equal(got, want) {
		t.Fatalf("layout\ngot  %x\nwant %x", got, want)
	}
	raw, err := EncodeBatch(b, true)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, append([]byte{0xc4, 32}, make([]byte, 31)...)) {
		t.Fatalf("hashAsBytes: no 32-byte bin hash in %x", raw)
	}
}

func TestDecodeBatchTruncated(t *testing.T) {
	for _, o := range []EncodeOptions{{}, {MapEvents: true, MapBatch: true, HashAsBytes: true}} {
		raw, err := EncodeBatchWith(sampleBatch(), o)
		if err != nil {
			t.Fatal(err)
		}
		for n := range len(raw) {
			if _, err := DecodeBatch(raw[:n]); err == nil {
				t.Fatalf("%+v: prefix of %d/%d bytes decoded", o, n, len(raw))
			}
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for _, o := range []EncodeOptions{{}, {HashAsBytes: true}, {MapEvents: true, MapBatch: true}} {
		raw, err := EncodeBatchWith(sampleBatch(), o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add(enc(f, arr{1.0, arr{arr{"BlockStored", arr{sha(1)}, int64(-1), arr{1}, 1, nil, "GPU", nil, arr{arr{"x"}}, 0, "k", 7}}}, true))
	f.Add([]byte{0x92, 0xcb})
	f.Add(enc(f, arr{1.0, arr{arr{"BlockStored", arr{1}, 0, arr{1 << 40}, 1}, arr{"BlockRemoved", arr{1}}}}, true))
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := DecodeBatch(raw)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if (b.RejectErr != nil) != (b.Rejects() > 0) {
			t.Fatalf("rejections %v with error %v", b.Rejected, b.RejectErr)
		}
		// Whatever decodes must survive a round trip unchanged (bar the
		// unknown and rejected events it dropped).
		b.Skipped, b.Rejected, b.RejectErr = 0, [NumRejectReasons]int{}, nil
		again, err := EncodeBatch(b, false)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		b2, err := DecodeBatch(again)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if math.IsNaN(b.TS) {
			b.TS, b2.TS = 0, 0
		}
		if !reflect.DeepEqual(b, b2) {
			t.Fatalf("unstable round trip\nfirst  %+v\nsecond %+v", b, b2)
		}
	})
}

// TestDecodeBatchRejectsOneEvent: an event that is valid msgpack but not a
// usable event is dropped alone, counted by reason; the events around it
// (a store before, a removal after) still decode.
func TestDecodeBatchRejectsOneEvent(t *testing.T) {
	tests := []struct {
		name   string
		ev     any
		reason RejectReason
	}{
		{name: "event not array or map", ev: "BlockStored", reason: RejectShape},
		{name: "event empty", ev: arr{}, reason: RejectShape},
		{name: "tag not string", ev: arr{1, arr{1}}, reason: RejectShape},
		{name: "BlockStored too short", ev: arr{"BlockStored", arr{1}, nil, arr{1}}, reason: RejectMissingField},
		{name: "BlockRemoved without hashes", ev: arr{"BlockRemoved"}, reason: RejectMissingField},
		{name: "hash float", ev: arr{"BlockRemoved", arr{1.5}}, reason: RejectBadField},
		{name: "hash nil", ev: arr{"BlockRemoved", arr{nil}}, reason: RejectBadField},
		{name: "hash bool", ev: arr{"BlockRemoved", arr{true}}, reason: RejectBadField},
		{name: "hash empty bytes", ev: arr{"BlockRemoved", arr{[]byte{}}}, reason: RejectBadField},
		{name: "hashes not list", ev: arr{"BlockRemoved", 5}, reason: RejectBadField},
		{name: "parent float", ev: arr{"BlockStored", arr{1}, 2.5, arr{1}, 1}, reason: RejectBadField},
		{name: "token string", ev: arr{"BlockStored", arr{1}, nil, arr{"a"}, 1}, reason: RejectBadField},
		{name: "token nil", ev: arr{"BlockStored", arr{1}, nil, arr{nil}, 1}, reason: RejectBadField},
		{name: "token beyond uint32", ev: arr{"BlockStored", arr{1}, nil, arr{int64(1) << 40}, 1}, reason: RejectTokenRange},
		{name: "block_size string", ev: arr{"BlockStored", arr{1}, nil, arr{1}, "16"}, reason: RejectBadField},
		{name: "block_size negative", ev: arr{"BlockStored", arr{1}, nil, arr{1}, -1}, reason: RejectBadField},
		{name: "lora_id string", ev: arr{"BlockStored", arr{1}, nil, arr{1}, 1, "x"}, reason: RejectBadField},
		{name: "medium int", ev: arr{"BlockStored", arr{1}, nil, arr{1}, 1, nil, 7}, reason: RejectBadField},
		{name: "map event without type", ev: obj{"block_hashes": arr{1}}, reason: RejectMissingField},
		{name: "map BlockStored without token_ids", ev: obj{"type": "BlockStored", "block_hashes": arr{1}, "block_size": 1}, reason: RejectMissingField},
		{name: "negative token", ev: arr{"BlockStored", arr{1}, nil, arr{-1}, 1}, reason: RejectTokenRange},
		{name: "token above int64", ev: arr{"BlockStored", arr{1}, nil, arr{uint64(math.MaxUint64)}, 1}, reason: RejectTokenRange},
		{name: "map token beyond uint32", ev: obj{"type": "BlockStored", "block_hashes": arr{1}, "token_ids": arr{int64(1) << 32}, "block_size": 1}, reason: RejectTokenRange},
	}
	good := arr{"BlockStored", arr{7}, nil, arr{1, 2}, 2}
	remove := obj{"type": "BlockRemoved", "block_hashes": arr{7}}
	want := []Event{
		{Kind: EventBlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{1, 2}, BlockSize: 2},
		{Kind: EventBlockRemoved, BlockHashes: []uint64{7}},
	}
	for _, tc := range tests {
		for _, compact := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/compact=%v", tc.name, compact), func(t *testing.T) {
				got, err := DecodeBatch(enc(t, arr{1.0, arr{good, tc.ev, remove}}, compact))
				if err != nil {
					t.Fatalf("one bad event failed the batch: %v", err)
				}
				if !reflect.DeepEqual(got.Events, want) {
					t.Fatalf("events around the bad one:\ngot  %+v\nwant %+v", got.Events, want)
				}
				var wantRej [NumRejectReasons]int
				wantRej[tc.reason] = 1
				if got.Rejected != wantRej || got.Rejects() != 1 || got.RejectErr == nil {
					t.Fatalf("rejected %v (err %v), want 1 x %s", got.Rejected, got.RejectErr, tc.reason)
				}
			})
		}
	}
}

// TestDecodeTokenIDRange: every id in [0, 2^32-1] is accepted, in both
// layouts and with the widest msgpack encodings.
func TestDecodeTokenIDRange(t *testing.T) {
	ids := arr{0, int64(math.MaxInt32), uint64(1) << 31, uint64(math.MaxUint32)}
	want := []uint32{0, math.MaxInt32, 1 << 31, math.MaxUint32}
	for _, ev := range []any{
		arr{"BlockStored", arr{1, 2}, nil, ids, 2},
		obj{"type": "BlockStored", "block_hashes": arr{1, 2}, "parent_block_hash": nil, "token_ids": ids, "block_size": 2},
	} {
		for _, compact := range []bool{false, true} {
			got, err := DecodeBatch(enc(t, arr{1.0, arr{ev}}, compact))
			if err != nil || len(got.Events) != 1 {
				t.Fatalf("decode %v: %v %+v", ev, err, got)
			}
			if !reflect.DeepEqual(got.Events[0].TokenIDs, want) {
				t.Fatalf("tokens %v, want %v", got.Events[0].TokenIDs, want)
			}
		}
	}
	for _, tc := range []struct {
		v  int64
		ok bool
	}{{0, true}, {math.MaxUint32, true}, {1 << 31, true}, {-1, false}, {math.MaxUint32 + 1, false}, {math.MinInt64, false}} {
		if _, ok := TokenID(tc.v); ok != tc.ok {
			t.Fatalf("TokenID(%d) ok=%v, want %v", tc.v, ok, tc.ok)
		}
	}
}

// TestDecodeParentZero: llm-d sends parent 0 for a chain's first block, vLLM
// nil; both mean "no parent", in the array and the map layout, as an int
// or as an all-zero byte string.
func TestDecodeParentZero(t *testing.T) {
	for _, parent := range []any{nil, 0, uint64(0), make([]byte, 32)} {
		for _, ev := range []any{
			arr{"BlockStored", arr{5}, parent, arr{1, 2}, 2},
			obj{"type": "BlockStored", "block_hashes": arr{5}, "parent_block_hash": parent, "token_ids": arr{1, 2}, "block_size": 2},
		} {
			got, err := DecodeBatch(enc(t, arr{1.0, arr{ev}}, false))
			if err != nil || len(got.Events) != 1 {
				t.Fatalf("decode %v: %v", ev, err)
			}
			if e := got.Events[0]; e.HasParent || e.ParentHash != 0 {
				t.Fatalf("parent %#v decoded as HasParent=%v %d", parent, e.HasParent, e.ParentHash)
			}
		}
	}
	// The encoder's llm-d style round-trips to the same event.
	b := Batch{TS: 1, Events: []Event{{Kind: EventBlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2}, BlockSize: 2}}}
	for _, o := range []EncodeOptions{{ZeroParent: true}, {ZeroParent: true, MapEvents: true}} {
		raw, err := EncodeBatchWith(b, o)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(raw, []byte{0x91, 0x05, 0x00}) && !bytes.Contains(raw, append([]byte("parent_block_hash"), 0x00)) {
			t.Fatalf("%+v: no literal 0 parent in %x", o, raw)
		}
		got, err := DecodeBatch(raw)
		if err != nil || !reflect.DeepEqual(got, b) {
			t.Fatalf("%+v: round trip %+v (%v)", o, got, err)
		}
	}
}

// TestDecoderReuse: one Decoder across payloads of every layout, large
// and small, rejected events and failures in between, decodes each like
// DecodeBatch does, and a steady stream of vLLM's usual batches decodes
// without allocating.
func TestDecoderReuse(t *testing.T) {
	var payloads [][]byte
	for _, o := range []EncodeOptions{{}, {HashAsBytes: true}, {MapEvents: true}, {MapEvents: true, MapBatch: true, HashAsBytes: true}} {
		for _, b := range []Batch{sampleBatch(), {TS: 2, Events: []Event{{Kind: EventAllBlocksCleared}}}, {Events: []Event{}}} {
			raw, err := EncodeBatchWith(b, o)
			if err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, raw)
		}
	}
	payloads = append(payloads, []byte{0x92, 0xcb}, // truncated
		enc(t, arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{-1}, 1}, arr{"BlockRemoved", arr{4, 5}}}}, true)) // one rejected
	var d Decoder
	for round := range 2 {
		for i, raw := range payloads {
			want, werr := DecodeBatch(raw)
			got, err := d.Decode(raw)
			if (err == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d payload %d: reused decoder\ngot  %+v (%v)\nwant %+v (%v)", round, i, got, err, want, werr)
			}
		}
	}
	// What vLLM sends on every step: GPU stores and removals (a lora_name
	// or an unusual spec kind is a string of its own, and allocates).
	raw, err := EncodeBatch(Batch{TS: 1, HasDPRank: true, Events: []Event{
		{Kind: EventBlockStored, BlockHashes: []uint64{1, 2}, ParentHash: 9, HasParent: true, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: MediumGPU},
		{Kind: EventBlockRemoved, BlockHashes: []uint64{7}, Medium: MediumGPU},
	}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := d.Decode(raw); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Decode allocates %.1f times per batch, want 0", n)
	}
}
