package payload

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// refStr reads the string at b[0] == '"' a byte at a time: a backslash
// escapes the next byte; a body cut after a backslash drops it.
func refStr(b []byte) (content []byte, complete bool, next int) {
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			if i+1 == len(b) {
				return b[1:i], false, len(b)
			}
			i++
		case '"':
			return b[1:i], true, i + 1
		}
	}
	return b[1:], false, len(b)
}

// str finds the closing quote with a search and counts the backslashes
// before it; every mix of quotes, backslashes and cuts must read as a byte
// loop reads it.
func TestScannerStr(t *testing.T) {
	rnd := rand.New(rand.NewPCG(9, 10))
	alpha := []byte(`ab\"`)
	for n := 0; n < 14; n++ {
		for k := 0; k < 400; k++ {
			b := []byte{' ', '"'}
			for range n {
				b = append(b, alpha[rnd.IntN(len(alpha))])
			}
			s := scanner{b: b}
			got, complete, ok := s.str()
			want, wcomplete, wnext := refStr(b[1:])
			if !ok || !bytes.Equal(got, want) || complete != wcomplete || s.i != wnext+1 {
				t.Fatalf("%q: str %q %v (next %d), byte loop %q %v (next %d)", b, got, complete, s.i, want, wcomplete, wnext+1)
			}
		}
	}
	if _, _, ok := (&scanner{b: []byte(`x"`)}).str(); ok {
		t.Fatal("str read a string that does not start at the cursor")
	}
}
