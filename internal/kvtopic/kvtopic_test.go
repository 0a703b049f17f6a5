package kvtopic

import "testing"

func TestCompile(t *testing.T) {
	tests := []struct {
		tmpl, name, addr string
		match, miss      []string
		err              bool
	}{
		{tmpl: DefaultTemplate, name: "r0", addr: "10.0.0.5:8000",
			match: []string{"kv@10.0.0.5:8000@meta-llama/Llama-3.1-8B", "kv@10.0.0.5:8000@"},
			miss:  []string{"kv@10.0.0.5:80001@m", "kv@10.0.0.50:8000@m", "kv@10.0.0.5:8000", ""}},
		{tmpl: "kv@{name}@{model}", name: "r0", addr: "h:1", match: []string{"kv@r0@x"}, miss: []string{"kv@r01@x"}},
		{tmpl: "vllm-{address}", name: "r0", addr: "h:1", match: []string{"vllm-h:1"}, miss: []string{"vllm-h:1x"}},
		{tmpl: "plain", name: "r0", addr: "h:1", match: []string{"plain"}, miss: []string{"plain2"}},
		{tmpl: "{model}@{model}", name: "r0", addr: "h:1", err: true},
		{tmpl: "kv@{pod}", name: "r0", addr: "h:1", err: true},
		{tmpl: "kv@{host}", name: "r0", addr: "nonsense", err: true},
	}
	for _, tc := range tests {
		p, err := Compile(tc.tmpl, tc.name, tc.addr)
		if (err != nil) != tc.err {
			t.Fatalf("%q: err %v, want error %v", tc.tmpl, err, tc.err)
		}
		for _, m := range tc.match {
			if !p.Match([]byte(m)) {
				t.Errorf("%q for %s: %q should match", tc.tmpl, tc.addr, m)
			}
		}
		for _, m := range tc.miss {
			if p.Match([]byte(m)) {
				t.Errorf("%q for %s: %q should not match", tc.tmpl, tc.addr, m)
			}
		}
	}
}
