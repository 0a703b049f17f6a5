package kv

import "testing"

// BenchmarkDecodeBatch: a typical engine step, 16 BlockStored events of one
// 16-token block each plus a removal, in the array layout.
func BenchmarkDecodeBatch(b *testing.B) {
	raw := benchBatch(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeBatch(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func benchBatch(b *testing.B) []byte {
	evs := arr{}
	for i := range 16 {
		toks := arr{}
		for j := range 16 {
			toks = append(toks, 1000+i*16+j)
		}
		evs = append(evs, arr{"BlockStored", arr{uint64(i + 1)}, uint64(i), toks, 16, nil, "GPU"})
	}
	evs = append(evs, arr{"BlockRemoved", arr{1, 2, 3}, "GPU"})
	return enc(b, arr{1.5, evs, 0}, true)
}

// BenchmarkDecoder is BenchmarkDecodeBatch through a reused Decoder, as a
// subscriber decodes: no allocation per batch.
func BenchmarkDecoder(b *testing.B) {
	raw := benchBatch(b)
	var d Decoder
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(raw); err != nil {
			b.Fatal(err)
		}
	}
}
