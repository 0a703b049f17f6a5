package proxyconf

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestChildrenAndTree(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	me, child := os.Getpid(), cmd.Process.Pid
	if got := Children(me); !slices.Contains(got, child) {
		t.Fatalf("Children(%d) = %v, want %d among them", me, got, child)
	}
	if got := Children(child); len(got) != 0 {
		t.Fatalf("sleep has children %v", got)
	}
	tree := Tree(me)
	if len(tree) == 0 || tree[0] != me || !slices.Contains(tree, child) {
		t.Fatalf("Tree(%d) = %v, want it first and %d in it", me, tree, child)
	}
	if Tree(0) != nil {
		t.Fatal("Tree(0) is not nil")
	}
}
