package nginx

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// The rendered njs carries the contract table of route/contract/glue.go:
// each table, parsed back out of the module (it is JSON), equals the Go
// one. The whole module is kept as a golden file.
func TestNJSCarriesContract(t *testing.T) {
	out, err := Render(mustParse(t, []byte(multiYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	js := string(out.JS)
	read := func(name string, v any) {
		t.Helper()
		m := regexp.MustCompile(`(?m)^var ` + name + ` = (.*);$`).FindStringSubmatch(js)
		if m == nil {
			t.Fatalf("the njs lacks var %s", name)
		}
		if err := json.Unmarshal([]byte(m[1]), v); err != nil {
			t.Fatalf("var %s: %v", name, err)
		}
	}
	field := contract.VerdictFieldNamed

	var vars, wantVars [][2]string
	read("VERDICT_VARS", &vars)
	for _, f := range contract.VerdictFields() {
		if f.Header != "" && f.NginxVar != "" && f.Kind == contract.KindString {
			wantVars = append(wantVars, [2]string{f.Header, f.NginxVar})
		}
	}
	if !reflect.DeepEqual(vars, wantVars) {
		t.Errorf("VERDICT_VARS %v, want %v", vars, wantVars)
	}
	for _, f := range wantVars {
		if !strings.Contains(string(out.Config), "js_var $"+f[1]+";") {
			t.Errorf("nginx.conf declares no js_var $%s for %s", f[1], f[0])
		}
	}
	var req, reason, bad string
	read("REQUIRED_HEADER", &req)
	read("REASON_HEADER", &reason)
	read("BAD_ANSWER", &bad)
	if req != field("server").Header || reason != field("reason").Header || bad != contract.BadAnswerReason {
		t.Errorf("REQUIRED_HEADER %q REASON_HEADER %q BAD_ANSWER %q", req, reason, bad)
	}
	var edit map[string]string
	read("EDIT", &edit)
	if want := map[string]string{"insert": field("kv_insert").Header, "at": field("kv_at").Header}; !reflect.DeepEqual(edit, want) {
		t.Errorf("EDIT %v, want %v", edit, want)
	}
	var actions map[string]string
	read("REASON_ACTIONS", &actions)
	wantA := map[string]string{}
	for _, r := range contract.ReasonRules() {
		wantA[r.Reason] = string(r.Action)
	}
	if !reflect.DeepEqual(actions, wantA) {
		t.Errorf("REASON_ACTIONS %v, want %v", actions, wantA)
	}
	var statuses []int
	read("RELAY_STATUSES", &statuses)
	if !reflect.DeepEqual(statuses, contract.RelayStatuses()) {
		t.Errorf("RELAY_STATUSES %v, want %v", statuses, contract.RelayStatuses())
	}
	var fc struct {
		Status        int
		Type, Message string
	}
	read("FAIL_CLOSED", &fc)
	if e := contract.FailClosedError; fc.Status != e.Status || fc.Type != e.Type || fc.Message != e.Message {
		t.Errorf("FAIL_CLOSED %+v, want %+v", fc, e)
	}

	golden := filepath.Join("testdata", "turnout.js.golden")
	if *update {
		if err := os.WriteFile(golden, out.JS, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./nginx -run NJS -update)", err)
	}
	if string(want) != js {
		t.Errorf("%s differs from the render (run with -update after checking the diff)", golden)
	}
}
