package bench

import (
	"os/exec"
	"testing"
	"time"
)

func TestParsePerfStat(t *testing.T) {
	out := "# started on Mon Nov 30 00:02:52 2026\n\n" +
		"1418,,raw_syscalls:sys_enter,159954386,100.00,,\n" +
		"<not counted>,,page-faults,0,100.00,,\n" +
		"400,,context-switches,159954386,100.00,,\n"
	got, err := parsePerfStat(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := (perfCounts{Syscalls: 1418, Faults: 0, CtxSwitches: 400}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if _, err := parsePerfStat("1418,,raw_syscalls:sys_enter,1,100.00,,\n"); err == nil {
		t.Fatal("a missing event parsed")
	}
}

// TestPerfStatCounts attaches perf to a process that makes system calls
// and expects them counted (skips where perf cannot attach).
func TestPerfStatCounts(t *testing.T) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		t.Skip("perf not installed")
	}
	busy := exec.Command("sh", "-c", "while :; do read x < /proc/self/stat; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { busy.Process.Kill(); busy.Wait() }()
	ps, err := startPerfStat(perf, t.TempDir(), []int{busy.Process.Pid})
	if err != nil {
		t.Skipf("perf cannot attach here: %v", err)
	}
	// Wait until the counted process has run a while (bounded).
	start, _ := procCPU(busy.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if c, _ := procCPU(busy.Process.Pid); c-start >= 50*time.Millisecond {
			break
		}
	}
	got, err := ps.stop()
	if err != nil {
		t.Fatal(err)
	}
	if got.Syscalls <= 0 {
		t.Fatalf("no system calls counted: %+v", got)
	}
}

// TestPerfStatNoProcess: a process perf cannot attach to is an error that
// says so, not a hang or zero counts.
func TestPerfStatNoProcess(t *testing.T) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		t.Skip("perf not installed")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	ps, err := startPerfStat(perf, t.TempDir(), []int{gone.Process.Pid})
	if err == nil {
		ps.stop()
		t.Fatal("perf attached to a process that has exited")
	}
	t.Log(err)
}
