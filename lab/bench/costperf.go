package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// perfCounts are kernel events of the proxy's processes over one run.
type perfCounts struct {
	Syscalls, Faults, CtxSwitches float64
}

// perfEvents are counted in this order (perfCounts' fields).
var perfEvents = []string{"raw_syscalls:sys_enter", "page-faults", "context-switches"}

// perfStat counts perfEvents of processes between start and stop: perf
// attaches with its events disabled and enables them on a control pipe, so
// its start-up time is not cut out of the run.
type perfStat struct {
	cmd     *exec.Cmd
	ctl     *os.File
	ack     *bufio.Reader
	ackFile *os.File
	out     string
	stderr  strings.Builder
}

// startPerfStat attaches perf to pids and enables counting.
func startPerfStat(perf, dir string, pids []int) (*perfStat, error) {
	if len(pids) == 0 {
		return nil, errors.New("perf stat: no process")
	}
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("perf stat: %w", err)
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, fmt.Errorf("perf stat: %w", err)
	}
	out := dir + string(os.PathSeparator) + "perf-stat.csv"
	cmd := exec.Command(perf, "stat", "-x", ",", "-o", out, "-D", "-1", "--control", "fd:3,4",
		"-e", strings.Join(perfEvents, ","), "-p", strings.Join(ps, ","))
	cmd.ExtraFiles = []*os.File{ctlR, ackW}
	p := &perfStat{cmd: cmd, ctl: ctlW, out: out}
	cmd.Stderr = &p.stderr
	err = cmd.Start()
	ctlR.Close()
	ackW.Close()
	if err != nil {
		ctlW.Close()
		ackR.Close()
		return nil, fmt.Errorf("perf stat: %w", err)
	}
	p.ack, p.ackFile = bufio.NewReader(ackR), ackR
	if err := p.command("enable"); err != nil {
		return nil, p.fail(err)
	}
	return p, nil
}

// command sends a control command and waits for perf's ack (bounded: a
// perf that cannot attach exits and closes the pipe).
func (p *perfStat) command(c string) error {
	if _, err := p.ctl.WriteString(c + "\n"); err != nil {
		return fmt.Errorf("perf stat %s: %w", c, err)
	}
	p.ackFile.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := p.ack.ReadString('\n')
	if err != nil {
		return fmt.Errorf("perf stat %s: no ack: %w", c, err)
	}
	// perf writes the ack with its terminating NUL, which leads the next.
	if a := strings.Trim(line, "\x00\n"); a != "ack" {
		return fmt.Errorf("perf stat %s: %q instead of an ack", c, a)
	}
	return nil
}

// fail ends perf and adds what it said (read once it has exited).
func (p *perfStat) fail(err error) error {
	p.cmd.Process.Kill()
	p.cmd.Wait()
	p.ctl.Close()
	p.ackFile.Close()
	if msg := strings.TrimSpace(p.stderr.String()); msg != "" {
		return fmt.Errorf("%w (perf: %s)", err, msg)
	}
	return err
}

// stop disables counting, ends perf and reads its counts.
func (p *perfStat) stop() (perfCounts, error) {
	if err := p.command("disable"); err != nil {
		return perfCounts{}, p.fail(err)
	}
	// perf writes its counts on SIGINT, then dies of it: its exit status
	// says nothing, the counts file does.
	p.cmd.Process.Signal(os.Interrupt)
	werr := p.cmd.Wait()
	p.ctl.Close()
	p.ackFile.Close()
	b, err := os.ReadFile(p.out)
	if err != nil {
		return perfCounts{}, fmt.Errorf("perf stat: %w (exit: %w)", err, werr)
	}
	return parsePerfStat(string(b))
}

// parsePerfStat reads perf stat -x , output: value,unit,event,...
func parsePerfStat(s string) (perfCounts, error) {
	vals := map[string]float64{}
	for line := range strings.SplitSeq(s, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil { // <not counted>: the process did not run
			v = 0
		}
		vals[f[2]] = v
	}
	for _, e := range perfEvents {
		if _, ok := vals[e]; !ok {
			return perfCounts{}, fmt.Errorf("perf stat: no %s in %q", e, s)
		}
	}
	return perfCounts{Syscalls: vals[perfEvents[0]], Faults: vals[perfEvents[1]], CtxSwitches: vals[perfEvents[2]]}, nil
}

// perfField is one field of each round's counts.
func perfField(cs []perfCounts, f func(perfCounts) float64) []float64 {
	out := make([]float64, len(cs))
	for i, c := range cs {
		out[i] = f(c)
	}
	return out
}
