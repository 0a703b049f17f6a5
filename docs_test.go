package turnout_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pendingPages are linked from the docs but not written yet (none now):
// the test skips a missing one instead of failing.
var pendingPages = map[string]bool{}

// Every relative link of README.md and docs/*.md reaches a file or folder
// of the tree, and a link's #anchor a heading of the page it names.
func TestDocsLinksResolve(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	pages = append(pages, "README.md", "BENCHMARKS.md", "CHANGELOG.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	n := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(stripCode(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			n++
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				if pendingPages[filepath.ToSlash(path)] {
					t.Logf("%s links %s, written on another branch", page, target)
					continue
				}
				t.Errorf("%s links %s: %v", page, target, err)
				continue
			}
			if anchor != "" && !hasAnchor(t, path, anchor) {
				t.Errorf("%s links %s: no heading with that anchor in %s", page, target, path)
			}
		}
	}
	if n < 20 {
		t.Errorf("found only %d relative links", n)
	}
}

// stripCode drops fenced code blocks, where "](" is not a link.
func stripCode(s string) string {
	return regexp.MustCompile("(?s)```.*?```").ReplaceAllString(s, "")
}

// hasAnchor reports whether a heading of the Markdown file at path gets the
// anchor GitHub derives: lower case, punctuation dropped, spaces to '-'.
func hasAnchor(t *testing.T, path, anchor string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, line := range strings.Split(stripCode(string(b)), "\n") {
		h := strings.TrimLeft(line, "#")
		if len(h) == len(line) || !strings.HasPrefix(h, " ") {
			continue
		}
		slug := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
		if slug == anchor {
			return true
		}
	}
	return false
}

// The link check sees a broken link and a broken anchor (it can fail).
func TestDocsLinkCheckCatchesBreakage(t *testing.T) {
	if hasAnchor(t, "README.md", "no-such-heading") || !hasAnchor(t, "README.md", "the-contract-post-internalroute") {
		t.Error("anchor check is wrong")
	}
	if _, err := os.Stat(filepath.Join("docs", "no-such-page.md")); err == nil {
		t.Error("a missing page exists")
	}
}

// TestGatewayAPIConformanceTests: every test the conformance table of
// docs/gateway-api.md names is declared somewhere in the tree, so the
// table cannot keep naming a test that was renamed or removed.
func TestGatewayAPIConformanceTests(t *testing.T) {
	doc, err := os.ReadFile("docs/gateway-api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## Conformance")
	if !ok {
		t.Fatal("docs/gateway-api.md has no Conformance section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	named := regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(section, -1)
	if len(named) < 16 {
		t.Fatalf("the conformance table names %d tests, want one or more per requirement", len(named))
	}
	declared := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			declared[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range named {
		name := m[1]
		if strings.HasSuffix(name, "_") { // a family, e.g. TestH2Conform_*
			found := false
			for d := range declared {
				found = found || strings.HasPrefix(d, name)
			}
			if !found {
				t.Errorf("docs/gateway-api.md names the family %s*, and no test has that prefix", name)
			}
			continue
		}
		if !declared[name] {
			t.Errorf("docs/gateway-api.md names %s, and no _test.go declares it", name)
		}
	}
}
