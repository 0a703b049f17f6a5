package bench

import "time"

// The VM stall probe: one thread pinned to each of turnout's CPUs (and the
// bench's own, where the client reads the answers) spins on
// the clock for a paced round's length, before the round, and records
// every stretch in which it did not run. A request arriving while its CPU
// is away (another task's slice, an interrupt, the hypervisor) waits that
// long whoever serves it, so the share of time lost in stretches over
// 100 µs is a floor under any server's tail on that CPU: above 1 %, no
// p99 <= 100 µs can be shown there.
//
// Each stretch over 50 µs is told apart by the thread's own switch counts
// (getrusage RUSAGE_THREAD), read only after one: an involuntary switch
// is another task taking the CPU (what real-time priority would remove);
// no switch at all is the kernel's interrupt work or the hypervisor
// (nothing in the guest removes it); a voluntary switch is the probe's
// own Go runtime parking it, left out of the shares.

// StallProbe is one CPU's stretches over one probe.
type StallProbe struct {
	CPU int
	// Bench is set for a CPU of the bench's own (its client's), not
	// turnout's: an answer waits there too, until the client runs.
	Bench    bool
	Duration time.Duration
	// Lost50 and Lost100 are the shares of the time lost in stretches
	// over 50 and 100 µs; N50 and N100 how many; Max the longest.
	Lost50, Lost100 float64
	N50, N100       int
	Max             time.Duration
	// Tasks and NoSwitch split Lost50 by cause (another task; interrupts
	// or the hypervisor), NoSwitch100 is NoSwitch's part in stretches over
	// 100 µs (the floor under a real-time server); Own is the probe's
	// runtime's share, not counted.
	Tasks, NoSwitch, NoSwitch100, Own float64
	// The kernel's view over the probe: the thread's run-queue wait
	// (/proc/thread-self/schedstat), the CPU's steal and irq + softirq
	// time (/proc/stat) as shares, its local timer interrupts and its
	// rescheduling and function call IPIs per second (/proc/interrupts
	// LOC, RES + CAL: each a VM exit).
	RunDelay, Steal, IRQ, LOCPerSec, IPIPerSec float64
}

// Stretches the probe records.
const (
	stallShort = 50 * time.Microsecond
	stallLong  = 100 * time.Microsecond
)
