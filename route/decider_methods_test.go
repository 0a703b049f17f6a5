package route

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// maxDeciderMethods bounds the Decider's methods, exported and unexported
// together: what is not deciding (the ledger, health bookkeeping, refusal
// counters, the extra writers, the tick loop) lives on types the Decider
// exposes once, and the pipeline's stages are the request's Txn's
// methods; lower the bound as more leaves, never raise it.
const maxDeciderMethods = 20

// TestDeciderMethodCount counts the methods declared on Decider in the
// package's non-test files.
func TestDeciderMethodCount(t *testing.T) {
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	var names []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, e.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 {
				continue
			}
			typ := fd.Recv.List[0].Type
			if st, ok := typ.(*ast.StarExpr); ok {
				typ = st.X
			}
			if id, ok := typ.(*ast.Ident); ok && id.Name == "Decider" {
				names = append(names, fd.Name.Name)
			}
		}
	}
	if len(names) < 5 {
		t.Fatalf("found %d Decider methods (%v): the scan is broken", len(names), names)
	}
	if len(names) > maxDeciderMethods {
		t.Errorf("Decider has %d methods, at most %d: %v", len(names), maxDeciderMethods, names)
	}
}
