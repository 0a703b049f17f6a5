package route

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
)

// configPages are the pages whose YAML examples are turnout configs, each
// with at least one (the README's, the schema's, KV's and PD's among them).
var configPages = []string{"README.md", "docs/configuration.md", "docs/clusters.md", "docs/kv-aware.md", "docs/prefill-decode.md", "docs/discovery.md", "docs/policies.md", "docs/flow-control.md", "docs/gateway-api.md"}

// Every YAML example in the README and the config pages of docs/ is a
// config turnout accepts, so the docs cannot drift from the schema.
func TestREADMEConfigExamples(t *testing.T) {
	var blocks [][][]byte
	for _, page := range configPages {
		b, err := os.ReadFile("../" + page)
		if err != nil {
			t.Fatal(err)
		}
		bs := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(b, -1)
		if len(bs) == 0 {
			t.Errorf("%s has no YAML example", page)
		}
		blocks = append(blocks, bs...)
	}
	for i, m := range blocks {
		cfg, err := config.ParseConfig(m[1])
		if err != nil {
			t.Errorf("README YAML example %d: %v", i+1, err)
			continue
		}
		s, err := New(cfg, Options{})
		if err != nil {
			t.Errorf("README YAML example %d: %v", i+1, err)
			continue
		}
		s.Close()
	}
}

// The README and the proxy pages quote only figures BENCHMARKS.md has
// (every "0.70x" or "0.70×" ratio of the proxy paths), and the README names
// the Node version .ci/run installs.
func TestREADMEFacts(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Skipf("README.md not found: %v", err)
	}
	bench, err := os.ReadFile("../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"README.md", "docs/haproxy.md", "docs/nginx.md", "docs/clusters.md"} {
		b, err := os.ReadFile("../" + page)
		if err != nil {
			t.Fatal(err)
		}
		ratios := regexp.MustCompile(`\b(\d+\.\d+)(?:x\b|×)`).FindAllSubmatch(b, -1)
		if len(ratios) == 0 && page == "README.md" {
			t.Fatal("no throughput ratios in README.md")
		}
		for _, m := range ratios {
			r := string(m[1])
			if !strings.Contains(string(bench), r+"×") && !strings.Contains(string(bench), r+"x") {
				t.Errorf("%s quotes %sx, which BENCHMARKS.md does not have", page, r)
			}
		}
	}
	if regexp.MustCompile(`\d+k req/s`).Match(readme) {
		t.Errorf("README quotes absolute req/s; BENCHMARKS.md reports ratios (2-core shared box)")
	}
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	// Debian bookworm's nodejs is 18.x: what .ci/run installs when npm is missing.
	if !strings.Contains(string(ci), "nodejs") || !strings.Contains(string(readme), "Node 18") {
		t.Errorf("README's Node version does not match what .ci/run installs (Debian bookworm nodejs 18)")
	}
}

// The README's contract section names every header of the verdict table,
// so a new row is documented where operators read the contract.
func TestREADMEListsVerdictHeaders(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Skipf("README.md not found: %v", err)
	}
	for _, f := range contract.VerdictFields() {
		if f.Header != "" && !strings.Contains(string(b), "`"+f.Header) {
			t.Errorf("README.md does not document the verdict header %s (row %q of route/contract/glue.go)", f.Header, f.Name)
		}
	}
}

// Every path the README names exists (its Layout table is the map of the
// tree: at least 20 of them), so it cannot point at a file that moved.
// Links are checked with the docs' (TestDocsLinksResolve, repository root).
func TestREADMELayoutPathsExist(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Skipf("README.md not found: %v", err)
	}
	s := string(b)
	start := strings.Index(s, "## Layout\n")
	end := strings.Index(s[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("README.md has no Layout section")
	}
	layout := s[start : start+1+end]
	n := 0
	for _, m := range regexp.MustCompile("`([a-z][a-z0-9_./<>*-]*)`").FindAllStringSubmatch(s, -1) {
		p := m[1]
		if !strings.Contains(p, "/") && !strings.HasSuffix(p, ".go") {
			continue // a name, not a path
		}
		glob := regexp.MustCompile(`<[a-z]+>`).ReplaceAllString(p, "*")
		if hits, _ := filepath.Glob("../" + strings.TrimSuffix(glob, "/")); len(hits) == 0 {
			t.Errorf("README names %s: no such file or folder", p)
		}
		if strings.Contains(layout, "`"+p+"`") {
			n++
		}
	}
	if n < 20 {
		t.Errorf("found %d paths in the Layout section, want the whole map", n)
	}
}
