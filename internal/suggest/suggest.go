// Package suggest finds the known name nearest to a misspelt one, for the
// "did you mean" of config fields, flags and commands.
package suggest

// Nearest is the name in names closest to got by edit distance, if it is
// within 2 edits (and got is not too short to guess from); else "".
func Nearest(got string, names []string) string {
	best, bestD := "", 3
	if len(got) < 3 {
		bestD = 2
	}
	for _, n := range names {
		if d := distance(got, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// distance is Levenshtein's; names are short and this runs only on errors.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
