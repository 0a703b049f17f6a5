package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Pinning keeps a bench's load generator and the turnout it measures on
// different CPUs: on a small machine their threads otherwise share the
// cores, and the client's own scheduling sets the measured tail.

// checkPinning refuses a turnout CPU list the bench process itself may run
// on ("" pins nothing: no check).
func checkPinning(turnoutCPUs string) error {
	if turnoutCPUs == "" {
		return nil
	}
	want, err := parseCPUList(turnoutCPUs)
	if err != nil {
		return fmt.Errorf("turnout cpus: %w", err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("turnout cpus: the bench's own CPUs: %w", err)
	}
	own, err := allowedCPUs(status)
	if err != nil {
		return fmt.Errorf("turnout cpus: %w", err)
	}
	for c := range want {
		if own[c] {
			return fmt.Errorf("turnout cpus %s: the bench may run on CPU %d too; start it on the other CPUs (taskset -c LIST turnout-lab ...)", turnoutCPUs, c)
		}
	}
	return nil
}

// allowedCPUs reads Cpus_allowed_list from a /proc/PID/status text.
func allowedCPUs(status []byte) (map[int]bool, error) {
	list, err := allowedCPUList(status)
	if err != nil {
		return nil, err
	}
	return parseCPUList(list)
}

// allowedCPUList is the Cpus_allowed_list of a /proc/PID/status text, as
// written there ("0", "0-1,3").
func allowedCPUList(status []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no Cpus_allowed_list in /proc/self/status")
}

// benchCPUs is the CPU list the bench process itself may run on.
func benchCPUs() (string, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "", fmt.Errorf("the bench's own CPUs: %w", err)
	}
	return allowedCPUList(status)
}

// parseCPUList parses a CPU list as taskset and the kernel write it:
// "0", "1-3", "0,2-3".
func parseCPUList(s string) (map[int]bool, error) {
	out := map[int]bool{}
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad CPU list %q", s)
			}
		}
		for c := a; c <= b; c++ {
			out[c] = true
		}
	}
	return out, nil
}
