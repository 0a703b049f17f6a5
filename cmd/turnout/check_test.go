package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/cli"
)

// checkRun runs turnout check with args on stdin and returns its error and
// the JSON events it logged.
func checkRun(t *testing.T, stdin string, args ...string) (error, []map[string]any) {
	t.Helper()
	var logs bytes.Buffer
	err := runCheck(append([]string{"--proxy", "none"}, args...), strings.NewReader(stdin), cli.NewLogger(&logs, "info", false))
	var evs []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal(l, &ev); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		evs = append(evs, ev)
	}
	return err, evs
}

// warnings are the "config warning" events: field -> problem.
func warnings(evs []map[string]any) map[string][]string {
	out := map[string][]string{}
	for _, ev := range evs {
		if ev["message"] == "config warning" {
			f, _ := ev["field"].(string)
			p, _ := ev["problem"].(string)
			out[f] = append(out[f], p)
		}
	}
	return out
}

const twoHeaderDeployments = `
nginx: {mode: header}
deployments:
  - name: llama
    models: [llama]
    policy: {name: prefix-affinity}
    pools: [{role: mixed, endpoints: [{name: l0, address: "127.0.0.1:1"}]}]
  - name: qwen
    models: [qwen]
    policy: {name: least-request}
    pools: [{role: mixed, endpoints: [{name: q0, address: "127.0.0.1:2"}]}]
`

// turnout check warns on each nginx header-mode combination the docs call
// broken, at the field that sets the mode, and on none of them in body mode.
func TestCheckWarnsNginxHeaderMode(t *testing.T) {
	for _, tc := range []struct {
		name, cfg string
		want      map[string]string // field -> part of its warning
	}{
		{"several deployments, prompt policy", twoHeaderDeployments, map[string]string{
			"nginx.mode": "400 model_required",
		}},
		{"a body-mode deployment takes requests without a model header", strings.Replace(twoHeaderDeployments, "    policy: {name: least-request}\n", "    policy: {name: least-request}\n    nginx_mode: body\n", 1), map[string]string{
			"nginx.mode": "policy prefix-affinity reads the prompt",
		}},
		{"pool policy and prefill/decode", `
deployments:
  - name: pd
    models: [pd]
    nginx_mode: header
    pools:
      - {role: prefill, endpoints: [{name: p0, address: "127.0.0.1:1"}]}
      - {role: decode, policy: {name: kv-aware}, endpoints: [{name: d0, address: "127.0.0.1:2"}]}
`, map[string]string{
			"deployments[0].nginx_mode": "prefill/decode",
		}},
		{"body mode", strings.Replace(twoHeaderDeployments, "nginx: {mode: header}\n", "", 1), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err, evs := checkRun(t, tc.cfg, "-")
			if err != nil {
				t.Fatalf("check: %v", err)
			}
			got := warnings(evs)
			for field, want := range tc.want {
				if !slices.ContainsFunc(got[field], func(p string) bool { return strings.Contains(p, want) }) {
					t.Errorf("no warning at %s containing %q; warnings: %q", field, want, got)
				}
			}
			if tc.want == nil && len(got) > 0 {
				t.Errorf("body mode: unexpected warnings %q", got)
			}
		})
	}
	// The first case warns on the policy too, and names the line.
	_, evs := checkRun(t, twoHeaderDeployments, "-")
	if ws := warnings(evs)["nginx.mode"]; len(ws) != 2 || !strings.Contains(ws[1], "prefix-affinity") {
		t.Errorf("want the model_required and the prefix-affinity warnings at nginx.mode, got %q", ws)
	}
	for _, ev := range evs {
		if ev["message"] == "config warning" && ev["line"] != float64(2) {
			t.Errorf("warning %v: want line 2 (nginx: {mode: header})", ev)
		}
	}
}

// turnout check writes nothing: the feedback token file serve would create
// beside the config is not created, and the directory is as it was.
func TestCheckWritesNothing(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "turnout.yaml")
	if err := os.WriteFile(f, []byte(strings.Replace(twoHeaderDeployments, "nginx: {mode: header}\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	before := listDir(t, dir)
	if err, _ := checkRun(t, "", "--config", f); err != nil {
		t.Fatal(err)
	}
	if after := listDir(t, dir); !slices.Equal(before, after) {
		t.Errorf("turnout check changed %s: %q before, %q after", dir, before, after)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		fi, _ := e.Info()
		out = append(out, e.Name()+" "+fi.Mode().String())
	}
	return out
}

// `helm template ... | turnout check -`: the config is taken from the
// ConfigMap holding turnout.yaml, its problems named after it; manifests
// without one, or with two, are refused with the reason.
func TestCheckStdinManifests(t *testing.T) {
	cm := func(name, cfg string) string {
		var b strings.Builder
		b.WriteString("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: " + name + "}\ndata:\n  turnout.yaml: |\n")
		for _, l := range strings.Split(strings.TrimSpace(cfg), "\n") {
			b.WriteString("    " + l + "\n")
		}
		return b.String()
	}
	svc := "---\napiVersion: v1\nkind: Service\nmetadata: {name: t}\nspec: {ports: [{port: 80}]}\n"
	bad := strings.Replace(twoHeaderDeployments, "role: mixed", "role: mixd", 1)

	err, evs := checkRun(t, svc+cm("t-turnout", twoHeaderDeployments), "-")
	if err != nil {
		t.Fatal(err)
	}
	if w := warnings(evs)["nginx.mode"]; len(w) == 0 {
		t.Errorf("the ConfigMap's config was not checked (no header-mode warning): %v", evs)
	}
	err, _ = checkRun(t, svc+cm("t-turnout", bad), "-")
	if err == nil || !strings.Contains(err.Error(), "mixd") || !strings.Contains(err.Error(), "ConfigMap t-turnout") {
		t.Errorf("a typo in the ConfigMap's config: want an error naming mixd and the ConfigMap, got %v", err)
	}
	if err, _ := checkRun(t, svc, "-"); err == nil || !strings.Contains(err.Error(), "no ConfigMap") {
		t.Errorf("manifests without the ConfigMap: got %v", err)
	}
	if err, _ := checkRun(t, cm("a", twoHeaderDeployments)+cm("b", twoHeaderDeployments), "-"); err == nil || !strings.Contains(err.Error(), "2 ConfigMaps") {
		t.Errorf("two ConfigMaps: got %v", err)
	}
	if err, _ := checkRun(t, bad, "--config", "-"); err == nil || !strings.Contains(err.Error(), "mixd") {
		t.Errorf("a plain config on stdin with a typo: got %v", err)
	}
}
