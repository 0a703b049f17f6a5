package payload

import (
	"bytes"
	"testing"
)

// BenchmarkDuplicateModelCheck is what the duplicate-"model" check adds to
// a model-only decision (the sweep of the body after the first "model"),
// against an IndexByte over the same bytes (the floor of any check).
func BenchmarkDuplicateModelCheck(b *testing.B) {
	body := bodyReadCases()[0].body
	var x Index
	b.Run("sweep", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			x.Build(body, false)
			if x.DuplicateModel() {
				b.Fatal("duplicate")
			}
		}
	})
	b.Run("build-only", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			x.Build(body, false)
		}
	})
}

func BenchmarkIndexByteFloor(b *testing.B) {
	body := bodyReadCases()[0].body
	n := 0
	for b.Loop() {
		n += bytes.IndexByte(body[20:], '~')
	}
	_ = n
}
