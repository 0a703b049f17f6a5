package route

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docPath is a path doc.go names: a folder or file from the repository
// root (route/..., internal/..., ...) or a file of route's own (decide.go).
var docPath = regexp.MustCompile(`(?:^|[\s(,;])((?:route|internal|control|lab|cmd|haproxy|nginx)(?:/[a-z0-9_]+)+(?:\.go)?|[a-z0-9_]+\.go)\b`)

// Every path doc.go's prose and layer table names exists, so the map of
// the engine cannot point at a file or package that moved.
func TestDocPathsExist(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(line, "//") {
			continue
		}
		for _, m := range docPath.FindAllStringSubmatch(line, -1) {
			p := m[1]
			if seen[p] {
				continue
			}
			seen[p] = true
			at := filepath.Join("..", filepath.FromSlash(p))
			if !strings.Contains(p, "/") {
				at = p // a file of route itself
			}
			if _, err := os.Stat(at); err != nil {
				t.Errorf("doc.go names %s: %v", p, err)
			}
		}
	}
	// The layer table alone names 30 packages: fewer means the match broke.
	if len(seen) < 30 {
		t.Errorf("found %d paths in doc.go, want its whole map: %v", len(seen), seen)
	}
}
