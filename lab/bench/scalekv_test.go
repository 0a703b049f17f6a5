package bench

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/route/kv"
)

// BenchmarkKVCore decodes and applies the mock publishers' batches (the
// ingest code without sockets) into an index of 1M blocks.
func BenchmarkKVCore(b *testing.B) {
	o := DefaultKVPubOptions()
	for b.Loop() {
		r, err := RunKVCore(o, 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.PerCore, "events/s/core")
		b.ReportMetric(r.BytesPerBlock, "B/block")
		b.ReportMetric(r.DecodeShare, "decode-share")
	}
}

// TestKVStreamIndexesExactly: the mock publishers' stream, through vLLM's
// wire format, leaves the index holding exactly what each publisher holds
// (no orphan chains, no removals of unknown blocks), the steady state the
// KV rows time.
func TestKVStreamIndexesExactly(t *testing.T) {
	o := DefaultKVPubOptions()
	o.Publishers, o.Held = 3, 200
	idx := kv.NewIndex(10000)
	streams := []*kvStream{newKVStream(o, 0), newKVStream(o, 1), newKVStream(o, 2)}
	var stores, removes int
	for i := range 300 {
		s := streams[i%3]
		p, err := kv.EncodeBatch(kv.Batch{TS: 1, Events: s.batch(), HasDPRank: true}, i%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kv.DecodeBatch(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			switch ev.Kind {
			case kv.EventBlockStored:
				stores++
			case kv.EventBlockRemoved:
				removes++
			}
		}
		idx.Apply(fmt.Sprint("r", i%3), b)
	}
	st := idx.Stats()
	if st.Orphans != 0 || st.UnknownRemoves != 0 || st.Misaligned != 0 || st.Filtered != 0 {
		t.Fatalf("index stats %+v: the stream should index exactly", st)
	}
	want := 0
	for _, s := range streams {
		want += len(s.held) - s.head
	}
	if st.Entries != want || want < 3*(o.Held-o.BlocksPerEvent) || want > 3*o.Held {
		t.Fatalf("index holds %d blocks, publishers %d (held %d each)", st.Entries, want, o.Held)
	}
	if removes == 0 || stores == 0 {
		t.Fatalf("%d stores, %d removes: want both in steady state", stores, removes)
	}
}
