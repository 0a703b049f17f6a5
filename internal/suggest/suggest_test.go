package suggest

import "testing"

func TestNearest(t *testing.T) {
	names := []string{"config", "listen", "haproxy-dir", "nginx-dir"}
	for got, want := range map[string]string{
		"confg":      "config",
		"cnofig":     "config",
		"haproxy-di": "haproxy-dir",
		"listne":     "listen",
		"bogus":      "",
		"x":          "",
	} {
		if n := Nearest(got, names); n != want {
			t.Errorf("Nearest(%q) = %q, want %q", got, n, want)
		}
	}
}
