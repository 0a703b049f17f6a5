package bench

import (
	"slices"
	"testing"
	"time"
)

// splitTrace is 40 conversations of 1-5 turns, interleaved: conversation
// c's turns share first hash id c.
func splitTrace() []Request {
	var reqs []Request
	for turn := range 5 {
		for c := range 40 {
			if turn > c%5 {
				continue
			}
			reqs = append(reqs, Request{Index: len(reqs), Arrival: time.Duration(len(reqs)) * 100 * time.Millisecond,
				HashIDs: []uint64{uint64(c), uint64(1000*c + turn)}})
		}
	}
	return reqs
}

func TestFrontOfTurnAlternates(t *testing.T) {
	reqs := splitTrace()
	for _, n := range []int{2, 3} {
		front := FrontOf(reqs, n, SplitTurn, 1)
		last := map[uint64]int{}
		starts := make([]int, n)
		for _, r := range reqs {
			f := front[r.Index]
			if f < 0 || f >= n {
				t.Fatalf("%d fronts: request %d on front %d", n, r.Index, f)
			}
			c := r.HashIDs[0]
			if p, ok := last[c]; ok {
				if f != (p+1)%n {
					t.Fatalf("%d fronts: conversation %d went from front %d to %d, want %d", n, c, p, f, (p+1)%n)
				}
			} else {
				starts[f]++
			}
			last[c] = f
		}
		for f, k := range starts {
			if k < 40/n/3 {
				t.Fatalf("%d fronts: first turns per front %v: front %d starts too few conversations", n, starts, f)
			}
		}
	}
	if slices.Equal(FrontOf(reqs, 2, SplitTurn, 1), FrontOf(reqs, 2, SplitTurn, 2)) {
		t.Fatal("seeds 1 and 2 start every conversation on the same front")
	}
	if !slices.Equal(FrontOf(reqs, 2, SplitTurn, 7), FrontOf(reqs, 2, SplitTurn, 7)) {
		t.Fatal("one seed gave two assignments")
	}
}

func TestFrontOfRequest(t *testing.T) {
	reqs := splitTrace()
	for i, f := range FrontOf(reqs, 3, SplitRequest, 5) {
		if f != i%3 {
			t.Fatalf("request %d on front %d, want %d", i, f, i%3)
		}
	}
	for _, f := range FrontOf(reqs, 1, SplitTurn, 5) {
		if f != 0 {
			t.Fatalf("one front: a request on front %d", f)
		}
	}
	if _, err := ParseSplit("session"); err == nil {
		t.Fatal(`ParseSplit("session") passed`)
	}
}

func TestJitterArrivals(t *testing.T) {
	reqs := splitTrace()
	if got := JitterArrivals(reqs, 0, 1); &got[0] != &reqs[0] {
		t.Fatal("jitter 0 copied the replay")
	}
	a := JitterArrivals(reqs, time.Second, 1)
	b := JitterArrivals(reqs, time.Second, 2)
	order := func(rs []Request) []int {
		var out []int
		for i, r := range rs {
			if i > 0 && r.Arrival < rs[i-1].Arrival {
				t.Fatalf("request %d arrives before the one ahead of it", r.Index)
			}
			out = append(out, r.Index)
		}
		return out
	}
	oa, ob := order(a), order(b)
	if slices.Equal(oa, ob) {
		t.Fatal("seeds 1 and 2 replay the same order")
	}
	slices.Sort(oa)
	if len(oa) != len(reqs) || oa[0] != 0 || oa[len(oa)-1] != len(reqs)-1 {
		t.Fatal("jitter lost or duplicated requests")
	}
	if a[0].Arrival != 0 || reqs[1].Arrival != 100*time.Millisecond {
		t.Fatalf("first arrival %v, the input's second %v: want 0 and untouched", a[0].Arrival, reqs[1].Arrival)
	}
}
