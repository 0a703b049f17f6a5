package bench

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

const tinyMooncake = `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 40, "input_length": 1500, "output_length": 0, "hash_ids": [1, 2, 3]}

{"timestamp": 90, "input_length": 10, "output_length": 7, "hash_ids": [9]}
`

func TestReadMooncake(t *testing.T) {
	reqs, err := ReadMooncake(strings.NewReader(tinyMooncake), TraceOptions{SessionBlocks: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 {
		t.Fatalf("got %d requests, want 3", len(reqs))
	}
	if reqs[1].Arrival != 40*time.Millisecond || reqs[1].InputTokens != 1500 || len(reqs[1].HashIDs) != 3 {
		t.Errorf("request 1 = %+v", reqs[1])
	}
	if reqs[1].OutputTokens != 1 {
		t.Errorf("output 0 must become 1 (max_tokens >= 1), got %d", reqs[1].OutputTokens)
	}
	if reqs[0].Session != "s1" || reqs[1].Session != "s1" || reqs[2].Session != "s9" {
		t.Errorf("sessions %q %q %q", reqs[0].Session, reqs[1].Session, reqs[2].Session)
	}

	limited, err := ReadMooncake(strings.NewReader(tinyMooncake), TraceOptions{Limit: 2})
	if err != nil || len(limited) != 2 || limited[0].Session != "" {
		t.Fatalf("limit 2: %d requests, err %v, session %q", len(limited), err, limited[0].Session)
	}
	for name, in := range map[string]string{
		"empty":       "\n\n",
		"bad json":    `{"timestamp": 0,`,
		"short ids":   `{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`,
		"no hash ids": `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}`,
	} {
		if _, err := ReadMooncake(strings.NewReader(in), TraceOptions{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := ReadMooncake(strings.NewReader(""), TraceOptions{}); !errors.Is(err, ErrEmptyTrace) {
		t.Errorf("empty trace: %v, want ErrEmptyTrace", err)
	}
}

func TestReadAzure(t *testing.T) {
	in := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:50.9951690,1100,109\n"
	reqs, err := ReadAzure(strings.NewReader(in), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 {
		t.Fatalf("got %d requests", len(reqs))
	}
	if want := 4314579 * time.Microsecond; reqs[1].Arrival != want {
		t.Errorf("arrival %v, want %v", reqs[1].Arrival, want)
	}
	if len(reqs[0].HashIDs) != 1 || len(reqs[1].HashIDs) != 3 {
		t.Errorf("hash ids %v %v", reqs[0].HashIDs, reqs[1].HashIDs)
	}
	// Lengths only: no two requests may share a chunk.
	seen := map[uint64]bool{}
	for _, r := range reqs {
		for _, id := range r.HashIDs {
			if seen[id] {
				t.Fatalf("chunk %d shared", id)
			}
			seen[id] = true
		}
	}
	if _, err := ReadAzure(strings.NewReader("x,1,2\n"), TraceOptions{}); err == nil {
		t.Error("bad timestamp accepted")
	}
}

func TestExpansionSharedPrefix(t *testing.T) {
	a := Request{InputTokens: 2 * BlockTokens, HashIDs: []uint64{7, 8}}
	b := Request{InputTokens: 3*BlockTokens - 100, HashIDs: []uint64{7, 8, 9}}
	c := Request{InputTokens: 2 * BlockTokens, HashIDs: []uint64{7, 10}}
	ta, tb, tc := AppendPromptText(nil, &a), AppendPromptText(nil, &b), AppendPromptText(nil, &c)
	if !bytes.HasPrefix(tb, ta) {
		t.Fatal("shared hash ids must give a byte-identical prefix")
	}
	if len(strings.Fields(string(ta))) != a.InputTokens || len(strings.Fields(string(tb))) != b.InputTokens {
		t.Fatalf("word counts %d %d, want %d %d", len(strings.Fields(string(ta))), len(strings.Fields(string(tb))), a.InputTokens, b.InputTokens)
	}
	// Chunk 7 is shared, chunk 10 is not.
	first := len(AppendPromptText(nil, &Request{InputTokens: BlockTokens, HashIDs: []uint64{7}}))
	if !bytes.Equal(ta[:first], tc[:first]) || bytes.Equal(ta[first:], tc[first:]) {
		t.Fatal("chunks must be equal exactly where the ids are")
	}
	if again := AppendPromptText(nil, &a); !bytes.Equal(again, ta) {
		t.Fatal("expansion is not deterministic")
	}
}

// The sim feeds the cache tokens it derives itself; they must be exactly
// what a mock replica derives from the body the e2e mode sends.
func TestPromptTokensMatchMock(t *testing.T) {
	for _, r := range []Request{
		{InputTokens: 1, OutputTokens: 1, HashIDs: []uint64{0}},
		{InputTokens: 700, OutputTokens: 3, HashIDs: []uint64{5, 6}},
		{InputTokens: 1024, OutputTokens: 3, HashIDs: []uint64{azureIDBase + 1<<20, azureIDBase + 1<<20 + 1}},
	} {
		body := AppendChatBody(nil, &r, BodyOptions{Model: "llama", Stream: true})
		want, err := mock.ChatPromptTokens(body)
		if err != nil {
			t.Fatalf("mock rejects the body: %v\n%.200s", err, body)
		}
		got := AppendPromptTokens(nil, &r)
		if len(got) != PromptTokens(&r) {
			t.Errorf("PromptTokens %d, tokens %d", PromptTokens(&r), len(got))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("tokens differ from the mock's: got %d tokens, want %d", len(got), len(want))
		}
	}
}

func TestSyntheticTraceShares(t *testing.T) {
	reqs := SyntheticTrace(50, 1)
	if len(reqs) != 50 {
		t.Fatalf("%d requests", len(reqs))
	}
	inf, _ := CacheBounds(reqs, 16, 1<<14)
	if inf <= 0.2 || inf >= 1 {
		t.Fatalf("synthetic trace reuse %v, want a clear share of reuse", inf)
	}
	again := SyntheticTrace(50, 1)
	if again[49].Arrival != reqs[49].Arrival || again[49].HashIDs[0] != reqs[49].HashIDs[0] {
		t.Fatal("synthetic trace is not deterministic")
	}
}
