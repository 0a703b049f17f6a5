package proxyconf

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ReadPID returns the master pid that the proxy prog ("haproxy", "nginx")
// wrote to the pid file at path, if that process exists. A stale pid file
// may name a reused pid: when /proc says the process is another program,
// it is refused, so a reload never signals another program.
func ReadPID(path, prog string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("%s pid file: %w", prog, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s pid file %s: bad pid %q", prog, path, bytes.TrimSpace(b))
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return 0, fmt.Errorf("%s pid %d from %s: %w", prog, pid, path, err)
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && !bytes.Contains(comm, []byte(prog)) {
		return 0, fmt.Errorf("%s pid file %s names pid %d, which is %q, not %s", prog, path, pid, bytes.TrimSpace(comm), prog)
	}
	return pid, nil
}

// InDir sets *p to dir/name when *p is unset and dir is set: the default
// place of a file the proxy writes (pid file, error log, socket).
func InDir(p *string, dir, name string) {
	if *p == "" && dir != "" {
		*p = filepath.Join(dir, name)
	}
}
