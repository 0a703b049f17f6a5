package config

import (
	"strings"
	"testing"
)

// A params struct may take another's params as its own (yaml ",inline"):
// predicted-ttft takes prefix-affinity's. Their keys decode, and an
// unknown key's error lists them among the known ones.
func TestDecodeParamsInline(t *testing.T) {
	type inner struct {
		BlockBytes int     `yaml:"block_bytes"`
		Threshold  float64 `yaml:"match_threshold"`
	}
	type Outer struct {
		Inner    inner   `yaml:",inline"`
		MarginMs float64 `yaml:"margin_ms"`
	}
	parse := func(params string) (*Config, error) {
		return ParseConfig([]byte(`
deployments:
  - name: a
    policy: {name: predicted-ttft, params: ` + params + `}
    pools: [{endpoints: [{name: a, address: 1.2.3.4:5}]}]
`))
	}
	cfg, err := parse("{block_bytes: 64, match_threshold: 0.5, margin_ms: 20}")
	if err != nil {
		t.Fatal(err)
	}
	var got Outer
	if err := cfg.Deployments[0].Policy.DecodeParams(&got); err != nil {
		t.Fatal(err)
	}
	if got.Inner.BlockBytes != 64 || got.Inner.Threshold != 0.5 || got.MarginMs != 20 {
		t.Fatalf("decoded %+v, want block_bytes 64, match_threshold 0.5, margin_ms 20", got)
	}
	cfg, err = parse("{block_byte: 64}")
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.Deployments[0].Policy.DecodeParams(&got)
	if err == nil || !strings.Contains(err.Error(), "block_bytes") || !strings.Contains(err.Error(), "margin_ms") {
		t.Fatalf("unknown key: error %v, want one naming the inline and the own keys", err)
	}
}
