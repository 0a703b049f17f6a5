package route

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/policy"
	"github.com/turnout/turnout/route/policy/toy"
)

// pipelinePolicyAPI is all the decision pipeline may use of route/policy:
// the registry and the per-request working memory, nothing of one policy.
var pipelinePolicyAPI = map[string]bool{"Registry": true, "DefaultRegistry": true, "NewWork": true}

// The decision pipeline names no policy: no non-test Go file of route or
// the packages above it in route/ (route/policy and its folders aside)
// spells a registered policy's name, uses a route/policy identifier beyond
// the registry, or imports a policy's own folder. A new policy then
// changes route/policy only (docs/policies.md, the toy's worked example).
func TestPipelineNamesNoPolicy(t *testing.T) {
	reg := policy.DefaultRegistry()
	reg.Policy(toy.Type, toy.NewFactory())
	names := map[string]bool{}
	for _, n := range reg.Names() {
		names[n] = true
	}
	if !names[toy.Type] || !names[policy.PrefixAffinityType] {
		t.Fatalf("registry names %v", reg.Names())
	}
	// The scan must see what it is meant to catch.
	if bad := scanPolicyNames(t, "x.go", `package route
import "github.com/turnout/turnout/route/policy"
var _ = policy.PrefixAffinityType
var _ = "toy-fewest-waiting"`, names); len(bad) != 2 {
		t.Fatalf("the scan found %v in a file naming two policies", bad)
	}
	var files int
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (path == "policy" || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		case strings.HasPrefix(path, filepath.Join("internal", "routetest")):
			return nil // test helpers (configs name policies)
		}
		files++
		for _, b := range scanPolicyNames(t, path, nil, names) {
			t.Errorf("%s", b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 20 {
		t.Fatalf("scanned %d files", files)
	}
	// A policy type spelled by the pipeline is caught through its package:
	// every built policy lives in route/policy or below it.
	pool := &fleet.Pool{Endpoints: []*fleet.Endpoint{{Name: "a", State: &fleet.State{}}}}
	for n := range names {
		p, err := reg.Build(&config.PolicyConfig{Name: n}, fleet.PolicyEnv{Pool: pool})
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if c, ok := p.(fleet.Closer); ok {
			c.Close()
		}
		if pkg := reflectPkg(p); !strings.HasPrefix(pkg, "github.com/turnout/turnout/route/policy") {
			t.Errorf("policy %s is a type of %s, outside route/policy", n, pkg)
		}
	}
}

// scanPolicyNames lists where the Go source of path (or src) names a
// policy: a string equal to one of names, an identifier of route/policy
// outside pipelinePolicyAPI, an import of a folder below route/policy.
func scanPolicyNames(t *testing.T, path string, src any, names map[string]bool) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	const pol = "github.com/turnout/turnout/route/policy"
	local := ""
	var out []string
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		switch {
		case p == pol:
			local = "policy"
			if im.Name != nil {
				local = im.Name.Name
			}
		case strings.HasPrefix(p, pol+"/"):
			out = append(out, fset.Position(im.Pos()).String()+": imports "+p)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BasicLit:
			if x.Kind == token.STRING {
				if s, err := strconv.Unquote(x.Value); err == nil && names[s] {
					out = append(out, fset.Position(x.Pos()).String()+": names policy "+s)
				}
			}
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && local != "" && id.Name == local && id.Obj == nil && !pipelinePolicyAPI[x.Sel.Name] {
				out = append(out, fset.Position(x.Pos()).String()+": uses policy."+x.Sel.Name)
			}
		}
		return true
	})
	return out
}

func reflectPkg(p fleet.Policy) string {
	t := reflect.TypeOf(p)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}
