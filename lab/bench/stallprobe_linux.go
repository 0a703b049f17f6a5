//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// probeStalls probes every CPU of the taskset list cpus at once for d.
func probeStalls(ctx context.Context, cpus string, d time.Duration) ([]StallProbe, error) {
	set, err := parseCPUList(cpus)
	if err != nil {
		return nil, fmt.Errorf("stall probe: %w", err)
	}
	list := make([]int, 0, len(set))
	for c := range set {
		list = append(list, c)
	}
	slices.Sort(list)
	// Each probe holds a P while it spins: with fewer, they would take
	// turns and count each other's turns as stalls.
	if n := len(list) + 1; runtime.GOMAXPROCS(0) < n {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	}
	out := make([]StallProbe, len(list))
	errs := make([]error, len(list))
	done := make(chan struct{})
	for i, c := range list {
		go func() {
			defer func() { done <- struct{}{} }()
			out[i], errs[i] = probeCPU(ctx, c, d)
		}()
	}
	for range list {
		<-done
	}
	return out, errors.Join(errs...)
}

// probeCPU spins on cpu for d. Its thread is never unlocked: it ends with
// the goroutine, and its affinity with it.
func probeCPU(ctx context.Context, cpu int, d time.Duration) (StallProbe, error) {
	runtime.LockOSThread()
	p := StallProbe{CPU: cpu, Duration: d}
	if err := pinThread(cpu); err != nil {
		return p, err
	}
	k0, err := readKernelView(cpu)
	if err != nil {
		return p, err
	}
	sw0, err := threadSwitches()
	if err != nil {
		return p, err
	}
	var lost50, lost100, tasks, noSwitch, noSwitch100, own time.Duration
	start := time.Now()
	end := start.Add(d)
	last := start
	for turn := 0; ; turn++ {
		now := time.Now()
		if gap := now.Sub(last); gap > stallShort {
			sw, err := threadSwitches()
			if err != nil {
				return p, err
			}
			switch {
			case sw.vol > sw0.vol:
				own += gap
			default:
				switch {
				case sw.invol > sw0.invol:
					tasks += gap
				case gap > stallLong:
					noSwitch100 += gap
					fallthrough
				default:
					noSwitch += gap
				}
				lost50 += gap
				p.N50++
				if gap > stallLong {
					lost100 += gap
					p.N100++
				}
				p.Max = max(p.Max, gap)
			}
			sw0 = sw
			// The getrusage call is the probe's, not a stall.
			now = time.Now()
		}
		last = now
		if now.After(end) || (turn&0xffff == 0 && ctx.Err() != nil) {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return p, err
	}
	k1, err := readKernelView(cpu)
	if err != nil {
		return p, err
	}
	wall := float64(time.Since(start))
	p.Lost50, p.Lost100 = float64(lost50)/wall, float64(lost100)/wall
	p.Tasks, p.NoSwitch, p.NoSwitch100, p.Own = float64(tasks)/wall, float64(noSwitch)/wall, float64(noSwitch100)/wall, float64(own)/wall
	p.RunDelay = float64(k1.runDelay-k0.runDelay) / wall
	if ticks := k1.total - k0.total; ticks > 0 {
		p.Steal = float64(k1.steal-k0.steal) / float64(ticks)
		p.IRQ = float64(k1.irq-k0.irq) / float64(ticks)
	}
	sec := wall / float64(time.Second)
	p.LOCPerSec, p.IPIPerSec = float64(k1.loc-k0.loc)/sec, float64(k1.ipi-k0.ipi)/sec
	return p, nil
}

// pinThread binds the calling thread, locked by its goroutine, to cpu
// alone (the bench process itself may run elsewhere: sched_setaffinity
// per thread).
func pinThread(cpu int) error {
	const cpuSetSize = 1024 // CPU_SETSIZE: the CPUs a unix.CPUSet holds
	if cpu < 0 || cpu >= cpuSetSize {
		return fmt.Errorf("stall probe: CPU %d out of range", cpu)
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("stall probe: pin to CPU %d: %w", cpu, err)
	}
	return nil
}

type switches struct{ vol, invol int64 }

// threadSwitches is the calling thread's context switch counts.
func threadSwitches() (switches, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return switches{}, fmt.Errorf("stall probe: getrusage: %w", err)
	}
	return switches{ru.Nvcsw, ru.Nivcsw}, nil
}

// kernelView is one reading of the kernel's counters for a CPU and the
// calling thread.
type kernelView struct {
	runDelay               int64 // ns
	total, steal, irq, loc uint64
	ipi                    uint64 // rescheduling and function call
}

func readKernelView(cpu int) (kernelView, error) {
	var k kernelView
	ss, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		return k, fmt.Errorf("stall probe: %w", err)
	}
	if f := strings.Fields(string(ss)); len(f) >= 2 {
		k.runDelay, _ = strconv.ParseInt(f[1], 10, 64)
	}
	st, err := os.ReadFile("/proc/stat")
	if err != nil {
		return k, fmt.Errorf("stall probe: %w", err)
	}
	name := "cpu" + strconv.Itoa(cpu)
	for line := range strings.Lines(string(st)) {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != name {
			continue
		}
		// user nice system idle iowait irq softirq steal ...
		for i, s := range f[1:] {
			v, _ := strconv.ParseUint(s, 10, 64)
			if i < 8 {
				k.total += v
			}
			switch i {
			case 5, 6:
				k.irq += v
			case 7:
				k.steal = v
			}
		}
	}
	irqs, err := cpuInterrupts(cpu)
	k.loc, k.ipi = irqs["LOC:"], irqs["RES:"]+irqs["CAL:"]
	return k, err
}

// cpuInterrupts is cpu's counts in /proc/interrupts by row name ("LOC:"),
// its columns following the header's CPU names.
func cpuInterrupts(cpu int) (map[string]uint64, error) {
	b, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		return nil, fmt.Errorf("stall probe: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	if !sc.Scan() {
		return nil, errors.New("stall probe: empty /proc/interrupts")
	}
	col := slices.Index(strings.Fields(sc.Text()), "CPU"+strconv.Itoa(cpu))
	if col < 0 {
		return nil, fmt.Errorf("stall probe: no CPU %d in /proc/interrupts", cpu)
	}
	out := map[string]uint64{}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > col+1 {
			if v, err := strconv.ParseUint(f[col+1], 10, 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out, nil
}
