package turnout_test

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

// engine are the packages of the decision engine: what the proxy glue and
// the contract it is rendered from must not import, directly or not.
var engine = []string{"route", "route/policy", "route/flow", "route/kv", "route/estimator",
	"route/tokenize", "route/models", "route/pd", "route/fleet"}

// TestGlueImportsNoEngine: the renderers of the proxy glue (haproxy/,
// nginx/) and route/contract reach no engine package through their
// imports (tests aside), the equivalent of `go list -deps ./haproxy ./nginx`.
func TestGlueImportsNoEngine(t *testing.T) {
	const module = "github.com/turnout/turnout"
	deps := map[string]string{} // module package -> who imports it
	var walk func(dir, via string)
	walk = func(dir, via string) {
		p, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, imp := range p.Imports {
			rel, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			if _, seen := deps[rel]; seen {
				continue
			}
			deps[rel] = via + " -> " + rel
			walk(filepath.FromSlash(rel), deps[rel])
		}
	}
	for _, root := range []string{"haproxy", "nginx", "route/contract"} {
		walk(root, root)
	}
	if _, ok := deps["route/contract"]; !ok {
		t.Fatalf("haproxy/ and nginx/ do not import route/contract: the walk is broken (%v)", deps)
	}
	for _, e := range engine {
		if why, ok := deps[e]; ok {
			t.Errorf("the glue imports engine package %s: %s", e, why)
		}
	}
}
