package route

import (
	"os"
	"regexp"
	"testing"
)

// Every YAML example in the README is a config turnout accepts, so the docs
// cannot drift from the schema.
func TestREADMEConfigExamples(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Skipf("README.md not found: %v", err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(b, -1)
	if len(blocks) < 3 {
		t.Fatalf("found %d YAML examples in README.md, want the main, KV and PD ones", len(blocks))
	}
	for i, m := range blocks {
		cfg, err := ParseConfig(m[1])
		if err != nil {
			t.Errorf("README YAML example %d: %v", i+1, err)
			continue
		}
		s, err := NewServer(cfg, Options{})
		if err != nil {
			t.Errorf("README YAML example %d: %v", i+1, err)
			continue
		}
		s.Close()
	}
}
