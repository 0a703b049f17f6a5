package proxyconf

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// parents maps every visible pid to its parent, read from /proc/PID/stat
// (Linux; elsewhere it is empty). /proc/PID/task/*/children is not always
// available, so /proc is scanned once per call.
func parents() map[int]int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make(map[int]int, len(ents))
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		var state byte
		var ppid int
		if _, err := fmt.Sscanf(string(b[i+1:]), " %c %d", &state, &ppid); err == nil {
			out[p] = ppid
		}
	}
	return out
}

// Children returns the direct children of pid (a proxy master's workers).
func Children(pid int) []int {
	out := []int{}
	for p, pp := range parents() {
		if pp == pid {
			out = append(out, p)
		}
	}
	return out
}

// Tree returns pid and all its descendants.
func Tree(pid int) []int {
	if pid <= 0 {
		return nil
	}
	parent := parents()
	tree := []int{pid}
	for k := 0; k < len(tree); k++ {
		for p, pp := range parent {
			if pp == tree[k] {
				tree = append(tree, p)
			}
		}
	}
	return tree
}
