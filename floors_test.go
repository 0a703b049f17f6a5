package turnout_test

import (
	"errors"
	"go/build"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestTopLevelFloors: the top-level folders form floors, no two of them
// importing each other in either direction through any of their packages
// (tests aside), so each one can be read knowing only those below it.
func TestTopLevelFloors(t *testing.T) {
	const module = "github.com/turnout/turnout"
	top := func(importPath string) (string, bool) {
		if importPath == module {
			return ".", true
		}
		rel, ok := strings.CutPrefix(importPath, module+"/")
		if !ok {
			return "", false
		}
		first, _, _ := strings.Cut(rel, "/")
		return first, true
	}
	edges := map[[2]string]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(path, 0)
		var noGo *build.NoGoError
		if errors.As(err, &noGo) {
			return nil
		}
		if err != nil {
			return err
		}
		from, _ := top(module + "/" + filepath.ToSlash(path))
		if path == "." {
			from = "."
		}
		for _, imp := range p.Imports {
			if to, ok := top(imp); ok && to != from {
				edges[[2]string{from, to}] = filepath.ToSlash(path) + " imports " + imp
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(edges) < 10 {
		t.Fatalf("found %d imports between top-level folders: the walk is broken", len(edges))
	}
	for e, why := range edges {
		if back, ok := edges[[2]string{e[1], e[0]}]; ok && e[0] < e[1] {
			t.Errorf("%s and %s depend on each other: %s; %s", e[0], e[1], why, back)
		}
	}
}
