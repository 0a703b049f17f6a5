package bench

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestChunkViewLeadingHits(t *testing.T) {
	v := newChunkView(2)
	v.sent([]uint64{1, 2, 3}, 0, false) // warm-up: placed, not counted
	v.sent([]uint64{1, 2, 9}, 0, true)  // 1, 2 were last sent to 0: 2 hits of 3
	v.sent([]uint64{1, 2}, 1, true)     // last at 0, now 1: a miss
	v.sent([]uint64{5, 2}, 0, true)     // 2 is at 1 now, and 5 is new: no leading hit
	hit, loadReq := v.result()
	if want := 2.0 / 7; hit != want {
		t.Errorf("hit %.4f, want %.4f", hit, want)
	}
	// Replica 0 got 2 of 3 counted requests: max/mean = 2 / 1.5.
	if want := 2 / 1.5; loadReq != want {
		t.Errorf("requests max/mean %.4f, want %.4f", loadReq, want)
	}
}

func TestSyncPromptsBody(t *testing.T) {
	trace := SyntheticTrace(4, 1)
	p := newSyncPrompts(trace, 1)
	for k := range trace {
		if p.chunks[k] != 1 {
			t.Errorf("request %d: %d chunks in a 1 KiB cut, want 1", k, p.chunks[k])
		}
		if n := len(p.texts[k]); n > 1<<10 {
			t.Errorf("request %d: %d bytes of text, want <= 1024", k, n)
		}
	}
	var a, b struct {
		Model    string `json:"model"`
		Messages []struct{ Content string }
	}
	if err := json.Unmarshal(p.body(nil, 0, 7), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(p.body(nil, 0, 8), &b); err != nil {
		t.Fatal(err)
	}
	if a.Model != "llama" || len(a.Messages) != 1 || !strings.HasSuffix(a.Messages[0].Content, string(p.texts[0])) {
		t.Fatalf("body %+v does not carry the prompt", a)
	}
	// Another pass: the same text behind another first word.
	if a.Messages[0].Content == b.Messages[0].Content || a.Messages[0].Content[1:] != b.Messages[0].Content[1:] {
		t.Errorf("passes 7 and 8: %.20q and %.20q, want the same text behind another word", a.Messages[0].Content, b.Messages[0].Content)
	}
}
