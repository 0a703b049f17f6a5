package cluster

import (
	"sync"
	"testing"

	"github.com/turnout/turnout/route/fleet"
)

// Producers on every P against one consumer: every decision handed over
// arrives once, intact, in each producer's order; none is lost or doubled
// across many laps of a small ring.
func TestRingConcurrent(t *testing.T) {
	const producers, per = 4, 20000
	r := newRing(8, 4) // small: many laps, many full rings
	var wg sync.WaitGroup
	for w := 0; w < producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; {
				// blocks = producer, sequence, and a check word
				if r.put(nil, nil, []uint64{uint64(w), uint64(i), uint64(w)*1e9 + uint64(i)}) {
					i++
				}
			}
		}()
	}
	next := make([]uint64, producers)
	got := 0
	for got < producers*per {
		s := r.peek()
		if s == nil {
			continue
		}
		if len(s.blocks) != 3 {
			t.Fatalf("slot with %d blocks", len(s.blocks))
		}
		w, i, check := s.blocks[0], s.blocks[1], s.blocks[2]
		if check != w*1e9+i {
			t.Fatalf("torn slot: %v", s.blocks)
		}
		if i != next[w] {
			t.Fatalf("producer %d: got %d, want %d (lost or reordered)", w, i, next[w])
		}
		next[w]++
		r.release(s)
		got++
	}
	wg.Wait()
	if s := r.peek(); s != nil {
		t.Fatalf("extra slot after all decisions: %v", s.blocks)
	}
	if r.claimed() != producers*per {
		t.Fatalf("claimed %d, want %d", r.claimed(), producers*per)
	}
}

// A full ring refuses at once, and takes decisions again once the
// consumer releases a slot; the size rounds up to a power of two.
func TestRingFull(t *testing.T) {
	r := newRing(3, 1)
	p := &fleet.Pool{Name: "p"}
	for i := 0; i < 4; i++ {
		if !r.put(p, nil, []uint64{uint64(i)}) {
			t.Fatalf("put %d refused in a ring of 4", i)
		}
	}
	if r.put(p, nil, []uint64{9}) {
		t.Fatal("put into a full ring accepted")
	}
	s := r.peek()
	if s == nil || s.blocks[0] != 0 || s.pool != p {
		t.Fatalf("first slot %+v", s)
	}
	r.release(s)
	if s.pool != nil {
		t.Fatal("released slot still holds its pool")
	}
	if !r.put(p, nil, []uint64{4}) {
		t.Fatal("put refused after a release")
	}
	for want := uint64(1); want <= 4; want++ {
		s := r.peek()
		if s == nil || s.blocks[0] != want {
			t.Fatalf("slot %v, want %d", s, want)
		}
		r.release(s)
	}
	if r.peek() != nil {
		t.Fatal("empty ring returned a slot")
	}
}
