package payload

import "testing"

// Issue 28 item 5: a second top-level "model" key, in any spelling Python's
// json reads as "model", is noticed; "model" elsewhere is not.
func TestDuplicateModel(t *testing.T) {
	for _, tc := range []struct {
		body string
		dup  bool
		cut  bool
	}{
		{`{"model":"a","messages":[{"role":"user","content":"hi"}],"model":"b"}`, true, false},
		{`{"model":"a","model":"b"}`, true, false},
		{`{"model":"a", "model"` + "\n\t :" + `"b"}`, true, false},
		{`{"model":"a","mod\u0065\u006C":"b"}`, true, false},
		{`{"model":"a","\u006dodel":"b"}`, true, false},
		{`{"model":"a","mod\u0065l":"b"}`, true, false},
		{`{"\u006d\u006f\u0064\u0065\u006c":"a","stream":true,"model":"b"}`, true, false},
		{`{"model":1,"model":"b"}`, true, false},
		{`{"messages":[],"model":"a","x":{"model":"nested"},"model":"b"}`, true, false},
		{`{"model":"a","messages":[{"role":"user","content":"say \"model\" twice: \"model\""}]}`, false, false},
		{`{"model":"a","tools":[{"parameters":{"properties":{"model":{"type":"string"}}}}]}`, false, false},
		{`{"model":"a","metadata":{"mod\u0065l":"b"}}`, false, false},
		{`{"model":"a","models":"b","modelx":1}`, false, false},
		{`{"model":"a","messages":[{"role":"user","content":"caf\u00e9"}]}`, false, false},
		{`{"model":"a","model":"b`, true, true},
	} {
		var x Index
		x.Build([]byte(tc.body), tc.cut)
		if got := x.DuplicateModel(); got != tc.dup {
			t.Errorf("%s: duplicate %v, want %v", tc.body, got, tc.dup)
		}
		// Reused, a plain body clears the flag.
		x.Build([]byte(`{"model":"a"}`), false)
		if x.DuplicateModel() {
			t.Errorf("%s: the flag outlived the body", tc.body)
		}
	}
}

// Ordinary bodies still build without allocating (the check adds two
// searches of the rest, no allocation).
func TestDuplicateCheckAllocs(t *testing.T) {
	for _, tc := range bodyReadCases() {
		var x Index
		x.Build(tc.body, false)
		if n := testing.AllocsPerRun(100, func() { x.Build(tc.body, false); _ = x.DuplicateModel() }); n != 0 {
			t.Errorf("%s: %v allocs per Build", tc.name, n)
		}
	}
}
