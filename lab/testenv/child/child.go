// Package child runs a child process of a test or a benchmark: its output
// in a log file, whether it has ended, and a stop that asks (SIGTERM)
// before it kills.
package child

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a started child process.
type Process struct {
	done chan struct{}
	cmd  *exec.Cmd
	err  error
}

// Start starts cmd with its stdout and stderr in the file log (created).
func Start(cmd *exec.Cmd, log string) (*Process, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, err
	}
	p := &Process{done: make(chan struct{}), cmd: cmd}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended (Wait's error); nil while it runs.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Stop sends SIGTERM, then SIGKILL after grace, and waits for the end;
// nothing when the process has ended, so a second Stop is harmless.
func (p *Process) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
