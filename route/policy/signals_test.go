package policy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/policy"
	"github.com/turnout/turnout/route/policy/toy"
)

const (
	fleetPath  = "github.com/turnout/turnout/route/fleet"
	policyPath = "github.com/turnout/turnout/route/policy"
)

// endpointIdentity are the fields of fleet.Endpoint a policy may read
// besides the signal accessors: what names the endpoint, never its state.
var endpointIdentity = map[string]bool{"Name": true, "Index": true, "Seed": true, "Address": true}

// stateTypes are fleet's types behind the accessors: no policy names a
// field or method of theirs.
var stateTypes = map[string]bool{"State": true, "EngineLoad": true, "StallState": true, "Feedback": true, "MsHistogram": true}

// signalReads is what one package's non-test code reads of an endpoint:
// the signals per type whose methods call the accessors (a constructor
// NewT counts as T's), and what it reads past the accessors.
type signalReads struct {
	byType  map[string]fleet.Signals // "pkgpath.Type"
	illegal []string
}

// accessorSignals maps each Endpoint accessor to its signal.
func accessorSignals() map[string]fleet.Signal {
	m := map[string]fleet.Signal{}
	for s := range fleet.NumSignals {
		m[s.Info().Accessor] = s
	}
	return m
}

// TestPolicySignals holds route/policy (and its folders) to the signal
// accessors: no policy reads an endpoint through anything else than an
// accessor of fleet's signal table or its identity fields, every type
// whose methods read signals declares them (fleet.Consumer), and every
// registered policy, built with the params that switch its stages on,
// declares at least the signals of every stage it is made of.
func TestPolicySignals(t *testing.T) {
	reads := scanSignalReads(t)
	for _, b := range reads.illegal {
		t.Errorf("%s", b)
	}
	if len(reads.byType) < 10 {
		t.Fatalf("the scan found signal reads in %d types: %v", len(reads.byType), reads.byType)
	}
	// The scan must see what it is meant to see.
	for typ, want := range map[string]fleet.Signals{
		policyPath + ".LoadScore":        fleet.SignalSet(fleet.SignalLoad),
		policyPath + ".EngineQueue":      fleet.SignalSet(fleet.SignalEngineQueue, fleet.SignalInflight),
		policyPath + ".KVAware":          fleet.SignalSet(fleet.SignalKVEvents, fleet.SignalKVBlockSize),
		policyPath + ".PredictedTTFT":    fleet.SignalSet(fleet.SignalLoad, fleet.SignalPending, fleet.SignalEngineTTFT, fleet.SignalFirstToken),
		policyPath + "/toy.noteFirst":    fleet.SignalSet(fleet.SignalWaiting),
		policyPath + ".BoundedServed":    fleet.SignalSet(fleet.SignalLoad, fleet.SignalAdmits, fleet.SignalServed),
		policyPath + ".LoRAIndex":        fleet.SignalSet(fleet.SignalAdapters),
		policyPath + ".Cycle":            fleet.SignalSet(fleet.SignalAvailable, fleet.SignalLoad, fleet.SignalServed),
		policyPath + ".Rotation":         fleet.SignalSet(fleet.SignalAvailable),
		policyPath + "/toy.fewerWaiting": fleet.SignalSet(fleet.SignalWaiting, fleet.SignalInflight),
	} {
		if got := reads.byType[typ]; got != want {
			t.Errorf("scan: %s reads %v, want %v", typ, got, want)
		}
	}

	// A Cycle's reads are its summary's (the pickers' Usable calls are
	// declared by each picker): Profile declares them from its Summary.
	full := (&policy.Profile{Summary: policy.Summary{Load: true, Served: true}}).Signals()
	if cy := reads.byType[policyPath+".Cycle"]; full&cy != cy {
		t.Errorf("a Profile with the full summary declares %v, its cycle reads %v", full, cy)
	}
	if s := (&policy.Profile{}).Signals(); s.Has(fleet.SignalServed) || s.Has(fleet.SignalLoad) {
		t.Errorf("a Profile without a summary declares %v", s)
	}

	// A stage that reads a signal only with a param on declares it only
	// then: the policy check leaves it out, an instance with the param on
	// must declare it.
	conditional := map[string]struct {
		s  fleet.Signals
		on fleet.Consumer
	}{
		policyPath + ".LoadGuard": {fleet.SignalSet(fleet.SignalServed), &policy.LoadGuard{Bounded: 1.1}},
	}
	for typ, c := range conditional {
		if got := c.on.Signals(); got&c.s != c.s {
			t.Errorf("%s with its condition on declares %v, not %v", typ, got, c.s)
		}
	}

	reg := policy.DefaultRegistry()
	reg.Policy(toy.Type, toy.NewFactory())
	pool := &fleet.Pool{Name: "p", Endpoints: []*fleet.Endpoint{{Name: "a", State: &fleet.State{}}, {Name: "b", Index: 1, State: &fleet.State{}}}}
	built := map[string]bool{}
	for _, src := range maximalPolicies(reg) {
		var pc config.PolicyConfig
		if err := yaml.Unmarshal([]byte(src), &pc); err != nil {
			t.Fatal(err)
		}
		p, err := reg.Build(&pc, fleet.PolicyEnv{Pool: pool, Rand: fleet.NewRand(1)})
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if c, ok := p.(fleet.Closer); ok {
			c.Close()
		}
		built[pc.Name] = true
		declared := fleet.SignalsOf(p)
		if declared == 0 {
			t.Errorf("%s declares no signals (fleet.Consumer)", src)
			continue
		}
		for typ := range stageTypes(reflect.ValueOf(p)) {
			if got := reads.byType[typ] &^ conditional[typ].s; got&^declared != 0 {
				t.Errorf("%s: %s reads %v, undeclared by the policy (it declares %v)", src, typ, got&^declared, declared)
			}
		}
	}
	for _, n := range reg.Names() {
		if !built[n] {
			t.Errorf("policy %s not checked: add it to maximalPolicies", n)
		}
	}
}

// maximalPolicies are a config per registered policy with the params that
// switch every optional stage on, and one composed of every stage.
func maximalPolicies(reg *policy.Registry) []string {
	out := []string{
		"{name: round-robin}",
		"{name: least-request}",
		"{name: session-hash}",
		"{name: prefix-affinity, params: {bounded_load: 1.1, session_affinity: true}}",
		"{name: kv-aware, params: {fallback: {bounded_load: 1.1, session_affinity: true}}}",
		"{name: lora-affinity, params: {prefix_weight: 4}}",
		"{name: predicted-ttft, params: {bounded_load: 1.1, session_affinity: true}}",
		"{name: " + toy.Type + "}",
	}
	var scorers, filters []string
	for _, n := range reg.ScorerNames() {
		scorers = append(scorers, "{name: "+n+"}")
	}
	for _, n := range reg.FilterNames() {
		filters = append(filters, "{name: "+n+", params: {bounded_load: 1.1}}")
	}
	for _, fb := range []string{"least-loaded", "score"} {
		out = append(out, fmt.Sprintf("{name: custom, stages: {filters: [%s], scorers: [%s], fallbacks: %s}}",
			strings.Join(filters, ", "), strings.Join(scorers, ", "), fb))
	}
	return out
}

// stageTypes lists the route/policy types (and its folders') reachable
// from v: the stages a policy is made of, whatever holds them.
func stageTypes(v reflect.Value) map[string]bool {
	out := map[string]bool{}
	seen := map[uintptr]bool{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		if !v.IsValid() {
			return
		}
		t := v.Type()
		if t.Name() != "" && !strings.HasPrefix(t.PkgPath(), policyPath) {
			return // another package's type holds no stage
		}
		if t.Name() != "" {
			out[t.PkgPath()+"."+t.Name()] = true
		}
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() || seen[v.Pointer()] {
				return
			}
			seen[v.Pointer()] = true
			walk(v.Elem())
		case reflect.Interface:
			walk(v.Elem())
		case reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		case reflect.Slice, reflect.Array:
			if k := t.Elem().Kind(); k != reflect.Pointer && k != reflect.Interface && k != reflect.Struct {
				return
			}
			for i := range v.Len() {
				walk(v.Index(i))
			}
		}
	}
	walk(v)
	return out
}

type listedPackage struct {
	ImportPath, Dir, Export string
	GoFiles                 []string
}

// scanSignalReads type-checks the non-test files of route/policy and its
// folders and lists what they read of fleet's endpoints.
func scanSignalReads(t *testing.T) signalReads {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-json", "./...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	exports := map[string]string{}
	var targets []listedPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		if p.ImportPath == policyPath || strings.HasPrefix(p.ImportPath, policyPath+"/") {
			targets = append(targets, p)
		}
	}
	if len(targets) < 2 {
		t.Fatalf("go list found %d packages under route/policy", len(targets))
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
	accessors := accessorSignals()
	r := signalReads{byType: map[string]fleet.Signals{}}
	for _, p := range targets {
		var files []*ast.File
		for _, f := range p.GoFiles {
			af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, af)
		}
		info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
		pkg, err := (&types.Config{Importer: imp}).Check(p.ImportPath, fset, files, info)
		if err != nil {
			t.Fatalf("type-check %s: %v", p.ImportPath, err)
		}
		for _, f := range files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				owner := funcOwner(pkg, fd)
				if fd.Recv != nil && fd.Name.Name == "LearnTTFT" {
					r.byType[owner] |= fleet.SignalSet(fleet.SignalFirstToken)
				}
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					se, ok := n.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					sel := info.Selections[se]
					if sel == nil || sel.Obj().Pkg() == nil || sel.Obj().Pkg().Path() != fleetPath {
						return true
					}
					recv := sel.Recv()
					if ptr, ok := recv.(*types.Pointer); ok {
						recv = ptr.Elem()
					}
					named, _ := recv.(*types.Named)
					if named == nil {
						return true
					}
					at := fset.Position(se.Pos()).String()
					name := sel.Obj().Name()
					switch typ := named.Obj().Name(); {
					case stateTypes[typ]:
						r.illegal = append(r.illegal, fmt.Sprintf("%s: reads fleet.%s.%s: reach an endpoint through its signal accessors (route/fleet/signals.go)", at, typ, name))
					case typ != "Endpoint" || endpointIdentity[name]:
					case owner == "":
						r.illegal = append(r.illegal, fmt.Sprintf("%s: %s reads Endpoint.%s outside a stage's or policy's method (or its NewT): its reads would be declared by nobody", at, fd.Name.Name, name))
					default:
						s, ok := accessors[name]
						if !ok {
							r.illegal = append(r.illegal, fmt.Sprintf("%s: reads Endpoint.%s, which is no signal accessor (route/fleet/signals.go)", at, name))
							return true
						}
						r.byType[owner] |= fleet.SignalSet(s)
					}
					return true
				})
			}
		}
	}
	return r
}

// funcOwner is the type a function's reads are declared by: its
// receiver's, or T's for a constructor NewT of pkg; "" for another
// function.
func funcOwner(pkg *types.Package, fd *ast.FuncDecl) string {
	if fd.Recv != nil {
		t := fd.Recv.List[0].Type
		if st, ok := t.(*ast.StarExpr); ok {
			t = st.X
		}
		if ix, ok := t.(*ast.IndexExpr); ok {
			t = ix.X
		}
		if id, ok := t.(*ast.Ident); ok {
			return pkg.Path() + "." + id.Name
		}
		return ""
	}
	if n, ok := strings.CutPrefix(fd.Name.Name, "New"); ok {
		if obj, ok := pkg.Scope().Lookup(n).(*types.TypeName); ok {
			return pkg.Path() + "." + obj.Name()
		}
	}
	return ""
}

// TestSignalAccessorsExist checks the signal table against fleet.Endpoint:
// every accessor it names is a method (TTFTLearner's aside), and names are
// unique.
func TestSignalAccessorsExist(t *testing.T) {
	ep := reflect.TypeOf(&fleet.Endpoint{})
	names := map[string]bool{}
	for s := range fleet.NumSignals {
		in := s.Info()
		if in.Name == "" || names[in.Name] {
			t.Errorf("signal %d: name %q empty or repeated", s, in.Name)
		}
		names[in.Name] = true
		if in.Without == "" {
			t.Errorf("signal %s: no Without", in.Name)
		}
		if iface, m, ok := strings.Cut(in.Accessor, "."); ok {
			if it := reflect.TypeOf((*fleet.TTFTLearner)(nil)).Elem(); iface != it.Name() {
				t.Errorf("signal %s: accessor %s", in.Name, in.Accessor)
			} else if _, ok := it.MethodByName(m); !ok {
				t.Errorf("signal %s: %s has no method %s", in.Name, iface, m)
			}
			continue
		}
		if _, ok := ep.MethodByName(in.Accessor); !ok {
			t.Errorf("signal %s: fleet.Endpoint has no method %s", in.Name, in.Accessor)
		}
	}
	var ps []string
	for p := range fleet.NumProducers {
		ps = append(ps, p.String())
	}
	sort.Strings(ps)
	for i := 1; i < len(ps); i++ {
		if ps[i] == ps[i-1] || ps[i] == "" {
			t.Errorf("producer names %v", ps)
		}
	}
}
