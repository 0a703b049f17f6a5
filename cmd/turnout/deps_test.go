package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryDepsExcludeTest keeps the shipped binary free of test/ code and
// the HAProxy renderer free of the SPOE agent: the mock and the bench
// harness live in internal/, and what the renderer shares with the agent
// lives in route/contract_spoe.go.
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
	main := deps("github.com/turnout/turnout/cmd/turnout")
	var sawRoute bool
	for _, p := range main {
		if p == mod+"test" || strings.HasPrefix(p, mod+"test/") {
			t.Errorf("cmd/turnout depends on %s: test/ holds tests only", p)
		}
		sawRoute = sawRoute || p == mod+"route"
	}
	if !sawRoute {
		t.Fatalf("go list -deps returned no %sroute: %d packages, the check saw nothing", mod, len(main))
	}
	for _, p := range deps("github.com/turnout/turnout/haproxy") {
		if p == mod+"route/spoe" {
			t.Errorf("haproxy/ depends on route/spoe: share the contract through route/contract_spoe.go")
		}
	}
}
