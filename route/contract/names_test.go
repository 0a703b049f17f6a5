package contract

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// headerIsBytes is the byte-by-byte definition headerIs must keep.
func headerIsBytes(raw, norm []byte) bool {
	if len(raw) != len(norm) {
		return false
	}
	for i, c := range raw {
		if normByte(c) != norm[i] {
			return false
		}
	}
	return true
}

// fold8 must be normByte on every byte value, in every lane, whatever the
// neighbouring bytes (a carry or borrow would leak into the next lane).
func TestFold8EveryByte(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for lane := 0; lane < 8; lane++ {
		for c := 0; c < 256; c++ {
			for k := 0; k < 64; k++ {
				var b [8]byte
				for i := range b {
					b[i] = byte(rnd.Uint32())
				}
				if k == 0 {
					b = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
				} else if k == 1 {
					b = [8]byte{'_', '_', '_', '_', '_', '_', '_', '_'}
				}
				b[lane] = byte(c)
				var want [8]byte
				for i := range b {
					want[i] = normByte(b[i])
				}
				got := fold8(binary.LittleEndian.Uint64(b[:]))
				if got != binary.LittleEndian.Uint64(want[:]) {
					t.Fatalf("fold8(%q) = %#x, want %q", b, got, want)
				}
			}
		}
	}
}

func TestHeaderIs(t *testing.T) {
	for _, tc := range []struct {
		raw, norm string
		want      bool
	}{
		{"X-Session-Id", "x-session-id", true},
		{"x_session_id", "x-session-id", true},
		{"X-SESSION-ID", "x-session-id", true},
		{"X-Request-Id", "x-session-id", false},
		{"X-Session-Ie", "x-session-id", false},
		{"Y-Session-Id", "x-session-id", false},
		{"X-Original-Method", "x-original-method", true},
		{"X-Original-Methoe", "x-original-method", false},
		{"X-Original-Uri", "x-original-uri", true},
		{"Content-Type", "content-type", true},
		{"Content-Typ", "content-type", false},
		{"X-Model", "x-model", true},
		{"X_MODEL", "x-model", true},
		{"X-Mode1", "x-model", false},
		{"Authoriz", "authoriz", true},
		{"x-\xc0ession-id", "x-\xe0ession-id", false}, // not ASCII: no case
		{"", "", true},
	} {
		if got := headerIs([]byte(tc.raw), []byte(tc.norm)); got != tc.want || got != headerIsBytes([]byte(tc.raw), []byte(tc.norm)) {
			t.Errorf("headerIs(%q, %q) = %v, want %v", tc.raw, tc.norm, got, tc.want)
		}
	}
	// Random names of every length up to 40, differing (or not) at one byte.
	rnd := rand.New(rand.NewPCG(3, 4))
	alpha := []byte("abcxyzABCXYZ-_09@[`{\x7f\x80\xff")
	for n := 0; n <= 40; n++ {
		for k := 0; k < 200; k++ {
			raw := make([]byte, n)
			for i := range raw {
				raw[i] = alpha[rnd.IntN(len(alpha))]
			}
			norm := normHeader(raw)
			if n > 0 && k%2 == 1 {
				norm[rnd.IntN(n)] = alpha[rnd.IntN(len(alpha))]
			}
			if got, want := headerIs(raw, norm), headerIsBytes(raw, norm); got != want {
				t.Fatalf("headerIs(%q, %q) = %v, byte by byte %v", raw, norm, got, want)
			}
		}
	}
}

func BenchmarkHeaderIs(b *testing.B) {
	raw, norm := []byte("X-Original-Method"), normHeader([]byte("X-Original-Method"))
	for b.Loop() {
		if !headerIs(raw, norm) {
			b.Fatal("no match")
		}
	}
}
