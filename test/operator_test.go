//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An operator's first hour: make run / make demo on a box where ports are
// taken, stopping them, and proxies that refuse to share a port.

// Offsets of every port scripts/lib.sh derives from PORT_BASE.
var portOffsets = []int{1, 2, 3, 4, 80, 81, 90, 91}

// freePortBase returns a PORT_BASE whose every derived port is free (TCP and UDP).
func freePortBase(t *testing.T) int {
	t.Helper()
	for range 200 {
		base := 20000 + rand.IntN(9000)
		ok := true
		for _, off := range portOffsets {
			if !portFree(base + off) {
				ok = false
				break
			}
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free PORT_BASE found")
	return 0
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	l.Close()
	pc, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	pc.Close()
	return true
}

// groupMembers lists the pids whose process group is pgid (from /proc).
func groupMembers(pgid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" {
			out = append(out, pid)
		}
	}
	return out
}

// startMake runs make with args in the repository, in a new process group
// (everything it starts stays in that group unless it escapes), output in a
// buffer. The group is killed at cleanup whatever the test found.
func startMake(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	var out bytes.Buffer
	cmd := exec.Command("make", append([]string{"--no-print-directory", "-o", "build", "BIN=" + TurnoutBin(t)}, args...)...)
	cmd.Dir = repoRoot()
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "TURNOUT_LOG_FORMAT=json")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		if left := groupMembers(pgid); len(left) > 0 {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("---- make %v output ----\n%s", args, out.String())
		}
	})
	return cmd, &out
}

// make run runs in the foreground and leaves nothing behind, however it is
// stopped: TERM to make (kill), KILL to make (make cannot pass anything on),
// INT to the whole group (Ctrl-C).
func TestMakeRunLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sig   syscall.Signal
		group bool
	}{
		{"kill make", syscall.SIGTERM, false},
		{"kill -9 make", syscall.SIGKILL, false},
		{"ctrl-c", syscall.SIGINT, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := freePortBase(t)
			cmd, _ := startMake(t, "run", "PORT_BASE="+strconv.Itoa(base))
			pgid := cmd.Process.Pid
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			turnout := fmt.Sprintf("http://127.0.0.1:%d", base+90)
			deadline := time.Now().Add(60 * time.Second)
			for {
				if v, err := Metric(t, turnout+"/metrics", "turnout_health_checks_total", `result="ok"`); err == nil && v > 0 {
					break
				}
				select {
				case err := <-exited:
					t.Fatalf("make run exited before serving: %v", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("make run did not serve within 60 s")
				}
				time.Sleep(100 * time.Millisecond)
			}
			// What an operator's dashboards look for first (issue 15 item 7).
			for _, m := range []string{"turnout_build_info", "go_goroutines", "process_resident_memory_bytes"} {
				if v, err := Metric(t, turnout+"/metrics", m); err != nil || v <= 0 {
					t.Errorf("metric %s: %v %v", m, v, err)
				}
			}
			if n := len(groupMembers(pgid)); n < 6 {
				t.Fatalf("want make, bash, 4 mocks and turnout in the group, found %d processes", n)
			}
			target := pgid
			if tc.group {
				target = -pgid
			}
			if err := syscall.Kill(target, tc.sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-exited:
			case <-time.After(20 * time.Second):
				t.Fatal("make did not exit")
			}
			Eventually(t, 15*time.Second, "every process make run started to exit", func() bool {
				return len(groupMembers(pgid)) == 0
			})
			for _, off := range []int{1, 2, 3, 4, 90, 91} {
				if p := base + off; !portFree(p) {
					t.Errorf("port %d still taken after make run stopped", p)
				}
			}
		})
	}
}

// make run shows a replica that dies (its name and log) and stops the rest.
func TestMakeRunShowsDeadMock(t *testing.T) {
	base := freePortBase(t)
	cmd, out := startMake(t, "run", "PORT_BASE="+strconv.Itoa(base))
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	WaitHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/healthz", base+90), 60*time.Second)
	victim := 0
	for _, pid := range groupMembers(pgid) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if args := strings.Split(string(b), "\x00"); len(args) > 1 && args[1] == "mock" && strings.Contains(string(b), "llama-2") {
			victim = pid
		}
	}
	if victim == 0 {
		t.Fatal("mock llama-2 not found in make run's process group")
	}
	_ = syscall.Kill(victim, syscall.SIGKILL)
	select {
	case err := <-exited:
		if err == nil {
			t.Fatal("make run exited 0 after a replica died")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("make run kept running without a replica")
	}
	if !strings.Contains(out.String(), "mock llama-2 exited unexpectedly") || !strings.Contains(out.String(), "---- mock llama-2") {
		t.Errorf("the dead replica and its log are not shown:\n%s", out)
	}
	// make run starts no HAProxy on purpose: no warning about its SPOE agent.
	if strings.Contains(out.String(), "no SPOE agent listens") {
		t.Errorf("make run warned about a missing SPOE agent:\n%s", out)
	}
	Eventually(t, 15*time.Second, "the other processes to stop", func() bool { return len(groupMembers(pgid)) == 0 })
}

// make run with a replica's port taken says which and by whom, and starts nothing.
func TestMakeRunBusyPort(t *testing.T) {
	base := freePortBase(t)
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+1))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd, out := startMake(t, "run", "PORT_BASE="+strconv.Itoa(base))
	if err := cmd.Wait(); err == nil {
		t.Fatalf("make run started with its first replica's port taken:\n%s", out)
	}
	want := fmt.Sprintf("port %d (mock llama-0) is in use by", base+1)
	if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("output lacks %q and the owner's pid:\n%s", want, out)
	}
	if left := groupMembers(cmd.Process.Pid); len(left) > 0 {
		t.Errorf("processes left: %v", left)
	}
}

// make demo names a busy port and its owner and fails; with the ports
// overridden it succeeds next to the process that holds them (the 8080 and
// 9090 of a box where another HAProxy and another service run).
func TestMakeDemoPorts(t *testing.T) {
	NeedHAProxy(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	base := freePortBase(t)
	var held []net.Listener
	for _, p := range []int{base + 80, base + 90} {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	cmd, out := startMake(t, "demo", "PORT_BASE="+strconv.Itoa(base))
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("make demo with busy ports: err %v, want a failure\n%s", err, out)
	}
	self := fmt.Sprintf("pid %d", os.Getpid())
	for _, want := range []string{
		fmt.Sprintf("port %d (haproxy) is in use by", base+80),
		fmt.Sprintf("port %d (turnout) is in use by", base+90),
		self, "PORT_BASE=",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("make demo output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out.String(), "starting 4 mock replicas") {
		t.Errorf("make demo started replicas before checking its ports:\n%s", out)
	}

	alt := freePortBase(t)
	cmd, out = startMake(t, "demo", "PORT_BASE="+strconv.Itoa(base),
		"HAPROXY_PORT="+strconv.Itoa(alt+80), "TURNOUT_PORT="+strconv.Itoa(alt+90))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatal("make demo did not finish in 3 minutes")
	}
	if err != nil {
		t.Fatalf("make demo with overridden ports: %v", err)
	}
	for _, want := range []string{fmt.Sprintf("haproxy at http://127.0.0.1:%d", alt+80), "48 requests served through haproxy, 0 without a replica answer", "turnout decisions: affinity=", "turnout in-flight after the run: 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("make demo output lacks %q:\n%s", want, out)
		}
	}
	if left := groupMembers(cmd.Process.Pid); len(left) > 0 {
		t.Errorf("make demo left processes behind: %v", left)
	}
}

// reusePortListen binds addr with SO_REUSEPORT, as a second HAProxy (or any
// server that sets it) would.
func reusePortListen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

// The rendered proxies own their listen port: another process cannot join
// it with SO_REUSEPORT and split the traffic (HAProxy sets it by default;
// the rendered global section turns it off; nginx only sets it on request).
func TestProxyPortNotShared(t *testing.T) {
	bin := TurnoutBin(t)
	check := func(t *testing.T, listen string) {
		t.Helper()
		l, err := reusePortListen(listen)
		if err == nil {
			l.Close()
			t.Fatalf("a second SO_REUSEPORT listener bound %s next to the proxy: traffic would be split", listen)
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("bind %s: %v, want address in use", listen, err)
		}
	}
	cfg := func(dir, haListen, ngListen string) string {
		path := filepath.Join(dir, "turnout.yaml")
		y := fmt.Sprintf("haproxy: {listen: %s}\nnginx: {listen: %s}\nhealth: {disable: true}\ndeployments:\n  - name: llama\n    pools: [{endpoints: [{name: a, address: %s}]}]\n", haListen, ngListen, FreeAddr(t))
		if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	t.Run("haproxy", func(t *testing.T) {
		NeedHAProxy(t)
		dir, listen := t.TempDir(), FreeAddr(t)
		if out, err := exec.Command(bin, "render", "haproxy", "--config", cfg(dir, listen, FreeAddr(t)), "--out", dir).CombinedOutput(); err != nil {
			t.Fatalf("render: %v\n%s", err, out)
		}
		h := StartHAProxy(t, dir, listen)
		Eventually(t, 10*time.Second, "haproxy to listen", func() bool {
			c, err := net.Dial("tcp", listen)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		check(t, listen)
		// A reload still works without SO_REUSEPORT (listeners are passed on).
		pid, _ := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, "haproxy.pid"))))
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGUSR2)
			time.Sleep(500 * time.Millisecond)
			Eventually(t, 10*time.Second, "haproxy to listen after a reload", func() bool {
				c, err := net.Dial("tcp", listen)
				if err == nil {
					c.Close()
				}
				return err == nil && !h.Exited()
			})
			check(t, listen)
		}
	})
	t.Run("nginx", func(t *testing.T) {
		NeedNginx(t)
		dir, listen := t.TempDir(), FreeAddr(t)
		args := []string{"render", "nginx", "--config", cfg(dir, FreeAddr(t), listen), "--out", dir}
		if os.Geteuid() == 0 {
			args = append(args, "--nginx-user", "root")
		}
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("render: %v\n%s", err, out)
		}
		StartNginx(t, dir, listen)
		check(t, listen)
	})
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	var b []byte
	Eventually(t, 5*time.Second, path, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil && len(b) > 0
	})
	return string(b)
}
