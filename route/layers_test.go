package route

import (
	"bufio"
	"errors"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/turnout/turnout/"

// layerRow is one row of doc.go's layer table: "//\t<layer> <package> <job>".
var layerRow = regexp.MustCompile(`^//\t(\d+) +(\S+) +(.+)$`)

// docLayers reads the layer table of doc.go: package path (module-relative)
// to layer, and the packages marked for tests only.
func docLayers(t *testing.T) (layers map[string]int, testOnly map[string]bool) {
	t.Helper()
	f, err := os.Open("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	layers, testOnly = map[string]int{}, map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := layerRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		if _, dup := layers[m[2]]; dup {
			t.Fatalf("doc.go names %s twice", m[2])
		}
		layers[m[2]] = n
		testOnly[m[2]] = strings.Contains(m[3], "(tests only)")
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(layers) < 10 {
		t.Fatalf("doc.go's layer table has %d rows: not found", len(layers))
	}
	return layers, testOnly
}

// packageImports lists, per package under route (and each package the
// table names outside it), the module packages its non-test files import.
func packageImports(t *testing.T, layers map[string]int) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	add := func(dir, rel string) {
		p, err := build.ImportDir(dir, 0)
		var noGo *build.NoGoError
		if errors.As(err, &noGo) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, modulePath) {
				out[rel] = append(out[rel], strings.TrimPrefix(imp, modulePath))
			}
		}
		if _, ok := out[rel]; !ok {
			out[rel] = nil
		}
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		add(path, filepath.ToSlash(filepath.Join("route", path)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for pkg := range layers {
		if !strings.HasPrefix(pkg, "route") {
			add(filepath.Join("..", filepath.FromSlash(pkg)), pkg)
		}
	}
	return out
}

// Every route package has a layer in doc.go and imports only packages of
// lower layers; the test helper package is imported by tests only.
func TestLayers(t *testing.T) {
	layers, testOnly := docLayers(t)
	imports := packageImports(t, layers)
	var pkgs []string
	for p := range imports {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		l, ok := layers[p]
		if !ok {
			t.Errorf("%s has no row in doc.go's layer table", p)
			continue
		}
		for _, imp := range imports[p] {
			il, ok := layers[imp]
			switch {
			case !ok:
				t.Errorf("%s imports %s, which has no row in doc.go's layer table", p, imp)
			case testOnly[imp]:
				t.Errorf("%s imports %s, a test helper, from a non-test file", p, imp)
			case il >= l:
				t.Errorf("%s (layer %d) imports %s (layer %d): a package imports only lower layers", p, l, imp, il)
			}
		}
	}
	for p := range layers {
		if _, ok := imports[p]; !ok {
			t.Errorf("doc.go's layer table names %s, which has no Go package", p)
		}
	}
}

// maxRootFiles bounds route's root: the Decider and the proxy contract;
// everything else has a package of its own (doc.go's layers).
const maxRootFiles = 15

func TestRootFileCount(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var src []string
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			src = append(src, f)
		}
	}
	if len(src) > maxRootFiles {
		t.Fatalf("route's root holds %d non-test Go files, at most %d: %s", len(src), maxRootFiles, strings.Join(src, " "))
	}
}
