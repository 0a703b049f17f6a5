package contract

import (
	"regexp"
	"testing"
)

func TestUnsafePathRegex(t *testing.T) {
	re := regexp.MustCompile("(?i)" + UnsafePathRegex)
	for _, c := range []struct {
		p   string
		bad bool
	}{
		{"/v1/chat/completions", false}, {"/v1/models", false}, {"/v1/a.b/c..d", false}, {"/v1/chat?x=/../", false},
		{"/v1/../metrics", true}, {"/v1/./x", true}, {"/v1/%2e%2e/metrics", true}, {"/v1/%2E./metrics", true},
		{"/v1/..", true}, {"/v1/x%2fy", true}, {"/v1/x%5Cy", true}, {"/v1/.%2e?a", true},
	} {
		if got := re.MatchString(c.p); got != c.bad {
			t.Errorf("%s: unsafe=%v, want %v", c.p, got, c.bad)
		}
	}
}
