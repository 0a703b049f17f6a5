package route

import (
	"fmt"
	"testing"
)

// Issue 28 item 3: a Txn given back to the pool keeps no body buffer larger
// than keepBodyCap (the buffers of a max_body above the default: uncounted
// in the pool), and keeps one up to it (no allocation per request).
func TestPooledTxnDropsLargeBody(t *testing.T) {
	d := mustServer(t, fmt.Sprintf(fourEndpoints, "round-robin"))
	for _, tc := range []struct {
		size int
		kept bool
	}{{4 << 10, true}, {keepBodyCap, true}, {keepBodyCap + 1, false}, {4 << 20, false}} {
		tx := d.Begin()
		tx.Buf.Body = make([]byte, 0, tc.size)
		d.End(tx)
		// Nothing else runs here: the pool gives back the same Txn, or
		// a new one (no buffer at all): either way nothing large stays.
		tx = d.Begin()
		if c := cap(tx.Buf.Body); c > keepBodyCap {
			t.Errorf("body buffer of %d bytes kept in the pool", c)
		} else if tc.kept && c != tc.size && c != 0 {
			t.Errorf("body buffer of %d bytes became %d", tc.size, c)
		}
		d.End(tx)
	}
}
