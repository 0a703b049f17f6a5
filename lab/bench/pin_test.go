package bench

import (
	"maps"
	"slices"
	"testing"
)

// TestParseCPUList: the kernel's and taskset's list forms, and bad lists refused.
func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"0": {0}, "1-3": {1, 2, 3}, "0,2-3": {0, 2, 3}} {
		got, err := parseCPUList(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
			t.Fatalf("%q: %v, want %v", in, keys, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "1,", "-1"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	own, err := allowedCPUs([]byte("Name:\tx\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed:\t1\n"))
	if err != nil || !own[0] || !own[1] || len(own) != 2 {
		t.Fatalf("allowed CPUs %v, %v", own, err)
	}
}

// TestCheckPinningRefusesOverlap: the bench runs on every CPU here unless
// started under taskset, so pinning turnout to a CPU it may use is refused.
func TestCheckPinningRefusesOverlap(t *testing.T) {
	if err := checkPinning(""); err != nil {
		t.Fatal(err)
	}
	if err := checkPinning("0-1023"); err == nil {
		t.Fatal("turnout pinned onto the bench's own CPUs without an error")
	}
}
