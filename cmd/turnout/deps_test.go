package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryDepsExcludeTest keeps the shipped binary free of test/ code, of
// the lab (the mock replica and the bench harness build into
// cmd/turnout-lab) and of the test servers under lab/testenv, and the
// HAProxy renderer free of the SPOE agent (what the renderer shares with the
// agent lives in route/contract/spoe.go).
func TestBinaryDepsExcludeTest(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH")
	}
	deps := func(pkg string) []string {
		t.Helper()
		out, err := exec.Command(goTool, "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	const mod = "github.com/turnout/turnout/"
	// Not in the serving binary: the reason each is kept out.
	banned := map[string]string{
		"test":            "test/ holds tests only",
		"lab/mock":        "the mock replica is turnout-lab's (cmd/turnout-lab)",
		"lab/bench":       "the bench harness is turnout-lab's (cmd/turnout-lab)",
		"lab/testenv":     "test servers are for tests",
		"cmd/turnout-lab": "the lab is its own binary",
	}
	inTree := func(p, dir string) bool { return p == mod+dir || strings.HasPrefix(p, mod+dir+"/") }
	main := deps("github.com/turnout/turnout/cmd/turnout")
	// Not in the serving binary either: client-go's generated clientset and
	// informer factory link every Kubernetes API group (about 36 MB);
	// control/discovery/kube has its own two-type client.
	heavy := map[string]bool{"k8s.io/client-go/kubernetes": true, "k8s.io/client-go/informers": true}
	var sawRoute bool
	for _, p := range main {
		if heavy[p] {
			t.Errorf("cmd/turnout depends on %s: it links every Kubernetes API group; use control/discovery/kube's Client", p)
		}
		for dir, why := range banned {
			if inTree(p, dir) {
				t.Errorf("cmd/turnout depends on %s: %s", p, why)
			}
		}
		sawRoute = sawRoute || p == mod+"route"
	}
	if !sawRoute {
		t.Fatalf("go list -deps returned no %sroute: %d packages, the check saw nothing", mod, len(main))
	}
	// The check can fail: the lab does link what the serving binary must not.
	var labHas []string
	for _, p := range deps("github.com/turnout/turnout/cmd/turnout-lab") {
		if inTree(p, "lab/mock") || inTree(p, "lab/bench") {
			labHas = append(labHas, p)
		}
	}
	if len(labHas) < 2 {
		t.Errorf("cmd/turnout-lab links %v, want lab/mock and lab/bench: the banned-package match is broken", labHas)
	}
	for _, p := range deps("github.com/turnout/turnout/haproxy") {
		if p == mod+"route/spoe" {
			t.Errorf("haproxy/ depends on route/spoe: share the contract through route/contract/spoe.go")
		}
	}
}
