//go:build linux

package bench

import (
	"context"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A second process spinning on the probe's CPU takes about half of it in
// scheduler slices: the probe must count that time as lost to another
// task, in stretches over 100 µs. A process, not a goroutine: a goroutine
// waits for one of the runtime's Ps (a GC worker or another test's
// goroutine takes it) and would not compete the whole time.
func TestProbeStallsSeesACompetingThread(t *testing.T) {
	cpu := runtime.NumCPU() - 1
	spin := exec.Command("sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = spin.Process.Kill(); _ = spin.Wait() }()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(spin.Process.Pid, &set); err != nil {
		t.Fatal(err)
	}
	ps, err := probeStalls(context.Background(), strconv.Itoa(cpu), 600*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].CPU != cpu {
		t.Fatalf("probes %+v, want one of CPU %d", ps, cpu)
	}
	p := ps[0]
	t.Logf("%+v", p)
	if p.Lost100 < 0.2 || p.Lost100 > p.Lost50 || p.N100 == 0 || p.N100 > p.N50 {
		t.Errorf("lost %.3f in >100 µs (%d), %.3f in >50 µs (%d): want a competitor's share", p.Lost100, p.N100, p.Lost50, p.N50)
	}
	if p.Tasks < p.NoSwitch || p.Max < stallLong {
		t.Errorf("tasks %.3f, no switch %.3f, longest %s: want the competitor's slices counted as another task's", p.Tasks, p.NoSwitch, p.Max)
	}
	if p.RunDelay < 0.2 {
		t.Errorf("the kernel's run-queue wait %.3f: want the competitor's share", p.RunDelay)
	}
	if p.LOCPerSec <= 0 {
		t.Errorf("local timer interrupts %.0f/s: want some on a busy CPU", p.LOCPerSec)
	}
}

func TestProbeStallsRefusesABadList(t *testing.T) {
	if _, err := probeStalls(context.Background(), "x", time.Millisecond); err == nil {
		t.Fatal("want an error for CPU list x")
	}
}
