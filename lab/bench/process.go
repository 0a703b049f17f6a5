package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/turnout/turnout/lab/testenv/child"
)

// proc is a child process the bench started and must stop: mocks, turnout,
// HAProxy. Output goes to DIR/NAME.log for post-mortems.
type proc struct {
	*child.Process
	name    string
	cmd     *exec.Cmd
	logPath string
}

// startProc starts bin with args; its output goes to dir/name.log.
func startProc(dir, name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	cmd := exec.Command(bin, args...)
	// Own process group: a Ctrl-C on the bench reaches the bench, which
	// then stops its children in order, not all at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cp, err := child.Start(cmd, logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	return &proc{Process: cp, name: name, cmd: cmd, logPath: logPath}, nil
}

// logTail returns the end of the process log for error messages.
func (p *proc) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}

// procSet stops everything it holds in reverse start order.
type procSet struct {
	procs []*proc
}

func (s *procSet) start(dir, name, bin string, args ...string) (*proc, error) {
	p, err := startProc(dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, p)
	return p, nil
}

func (s *procSet) stopAll() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].Stop(5 * time.Second)
	}
	s.procs = nil
}
