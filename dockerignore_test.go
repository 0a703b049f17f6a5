package turnout_test

import (
	"os"
	"strings"
	"testing"
)

// The image build context (examples/Dockerfile: COPY . .) leaves out what is
// never built: bin/ (~85 MB), .git, bench output, node_modules.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile(".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			have[strings.TrimSuffix(strings.TrimPrefix(l, "/"), "/")] = true
		}
	}
	for _, want := range []string{"bin", ".git", "bench-out", "**/node_modules"} {
		if !have[want] {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
	// Nothing the build needs is excluded.
	for _, need := range []string{"go.mod", "go.sum", "Makefile", "cmd", "templates", "lua"} {
		if have[need] {
			t.Errorf(".dockerignore excludes %s, which make build needs", need)
		}
	}
}
