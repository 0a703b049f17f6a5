//go:build linux

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/turnout/turnout/route/contract"
)

// spinPaced is the paced load of an HTTP target without Go timers: Go's
// netpoller sleeps in whole milliseconds (epoll's timeout), so a timer
// pacer sends up to a millisecond late and its own lateness sets the tail
// it measures. One goroutine, locked to its thread, never sleeps: it sends
// the i-th request at start + i/rate on a free connection of conns
// (non-blocking writes on the connections' sockets) and polls one epoll
// set of them without a timeout for the answers, so a send and an answer's
// arrival are seen within one loop turn (µs). It needs a CPU of its own
// (the bench pinned apart from turnout, --turnout-cpus): it burns it.
// reqs are whole HTTP/1.1 requests, sent in turn; fb closes each decision
// as routeWorker does. Latencies run from the intended send time; the
// client's lateness counts from the later of that and the moment its
// connection was free (a send that waited for one is counted Queued: the
// server's backlog). With fifo above 0 the thread runs under SCHED_FIFO
// at that priority and sleeps in epoll until an answer or its next send,
// a timerfd armed to it in the same set (hrtimer precision): other tasks
// on its CPU then cannot delay it, and it cannot starve them.
func spinPaced(ctx context.Context, addr string, reqs [][]byte, fb feedbackTo, conns int, rate float64, d time.Duration, fifo int) (*LoadResult, error) {
	if rate <= 0 || conns < 1 || len(reqs) == 0 {
		return nil, errors.New("spin paced: rate, conns and requests must be positive")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("spin paced: epoll: %w", err)
	}
	defer syscall.Close(ep)
	timer := -1
	if fifo > 0 {
		if timer, err = sleepUntilDue(ep, conns); err != nil {
			return nil, err
		}
		defer syscall.Close(timer)
		if err := setThreadFIFO(fifo); err != nil {
			return nil, err
		}
		// Back to the default before the thread is unlocked.
		defer setThreadFIFO(0)
	}
	cs := make([]*spinConn, conns)
	defer func() {
		for _, c := range cs {
			if c != nil {
				c.close()
			}
		}
	}()
	for i := range cs {
		if cs[i], err = dialSpinConn(addr, fb); err != nil {
			return nil, err
		}
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(i)}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, cs[i].fd, &ev); err != nil {
			return nil, fmt.Errorf("spin paced: epoll add: %w", err)
		}
	}
	total := int(rate * d.Seconds())
	res := LoadResult{Latencies: make([]time.Duration, 0, total), Late: make([]time.Duration, 0, total)}
	free := make([]int, 0, conns)
	for i := range cs {
		free = append(free, i)
	}
	events := make([]syscall.EpollEvent, conns)
	gap := float64(time.Second) / rate
	cpu0 := threadCPU()
	start := time.Now()
	drainBy := d + 10*time.Second
	for seq, busy, turn := 0, 0, 0; seq < total || busy > 0; turn++ {
		now := time.Since(start)
		if turn&1023 == 0 && (ctx.Err() != nil || now > drainBy) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("spin paced: %d answers missing %s after the last send", busy, drainBy-d)
		}
		if due := time.Duration(float64(seq) * gap); seq < total && due <= now && len(free) > 0 {
			// The longest free first: one freed in the same loop turn
			// as the send fell due must not count it as queued while an
			// older one was free.
			c := cs[free[0]]
			free = append(free[:0], free[1:]...)
			c.due = start.Add(due)
			from := due
			if c.freed > due {
				from = c.freed
				res.Queued++
			}
			res.Late = append(res.Late, now-from)
			if err := c.send(reqs[seq%len(reqs)]); err != nil {
				return nil, err
			}
			seq++
			busy++
			continue
		}
		wait := 0
		if timer >= 0 {
			// The runtime waits for a raw call to return (a collection,
			// the drain bound above): 10 ms at most.
			wait = 10
			if due := time.Duration(float64(seq) * gap); seq < total && len(free) > 0 {
				if err := armTimer(timer, due-time.Since(start)); err != nil {
					return nil, err
				}
			}
		}
		n, err := epollWait(ep, events, wait, timer >= 0)
		if err != nil && !errors.Is(err, syscall.EINTR) {
			return nil, fmt.Errorf("spin paced: epoll wait: %w", err)
		}
		for _, ev := range events[:max(n, 0)] {
			if int(ev.Fd) == conns {
				var buf [8]byte
				_, _ = syscall.Read(timer, buf[:])
				continue
			}
			c := cs[ev.Fd]
			done, err := c.read()
			if err != nil {
				return nil, err
			}
			if !done {
				continue
			}
			lat := time.Since(c.due)
			c.freed = time.Since(start)
			busy--
			free = append(free, int(ev.Fd))
			if err := c.answered(); err != nil {
				res.Errors++
				if res.FirstErr == nil {
					res.FirstErr = err
				}
				continue
			}
			res.Latencies = append(res.Latencies, lat)
			res.Requests++
		}
	}
	res.Elapsed = time.Since(start)
	res.SenderCPU = threadCPU() - cpu0
	return &res, nil
}

// epollWait is EpollWait; raw (the Go runtime not told) for the sleeping
// real-time pacer: told, it hands the thread's P away while it sleeps, and
// getting one back on waking waits for a default-policy thread of the
// bench, which other tasks on the CPU delay. Raw by hand: x/sys/unix's
// EpollWait tells the runtime too.
func epollWait(ep int, events []syscall.EpollEvent, msec int, raw bool) (int, error) {
	if !raw {
		return syscall.EpollWait(ep, events, msec)
	}
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// sleepUntilDue adds a timerfd to ep, its events marked id, for a pacer
// that sleeps until its next send.
func sleepUntilDue(ep, id int) (int, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("spin paced: timerfd: %w", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(id)}
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("spin paced: epoll add timerfd: %w", err)
	}
	return fd, nil
}

// armTimer sets the timerfd to fire once after in (at once when in is not
// positive).
func armTimer(fd int, in time.Duration) error {
	in = max(in, time.Nanosecond) // zero would disarm it
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(in))}
	if err := unix.TimerfdSettime(fd, 0, &spec, nil); err != nil {
		return fmt.Errorf("spin paced: timerfd settime: %w", err)
	}
	return nil
}

// setThreadFIFO puts the calling thread under SCHED_FIFO at prio, or back
// under the default policy with prio 0. Its nice value is kept.
func setThreadFIFO(prio int) error {
	attr, err := unix.SchedGetAttr(0, 0)
	if err == nil {
		attr.Policy, attr.Priority = unix.SCHED_FIFO, uint32(prio)
		if prio == 0 {
			attr.Policy = unix.SCHED_NORMAL
		}
		err = unix.SchedSetAttr(0, attr, 0)
	}
	if err != nil {
		return fmt.Errorf("spin paced: sched_setattr %d: %w", prio, err)
	}
	return nil
}

// spinConn is one keep-alive connection of spinPaced, used through its
// non-blocking socket directly.
type spinConn struct {
	c   net.Conn
	fd  int
	fb  *closer
	due time.Time
	// freed is when its last answer was read (since the run's start).
	freed time.Duration
	in    []byte
	// hdrEnd and size are the answer's head end and total length once its
	// head is in (0 before).
	hdrEnd, size int
}

func dialSpinConn(addr string, fb feedbackTo) (*spinConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("spin paced: dial: %w", err)
	}
	sc := &spinConn{c: c, in: make([]byte, 0, 4096)}
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) { sc.fd = int(fd) })
	}
	if err == nil {
		sc.fb, err = newCloser(fb)
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("spin paced: %w", err)
	}
	return sc, nil
}

func (c *spinConn) close() {
	_ = c.fb.Close()
	_ = c.c.Close()
}

// send writes req whole (loopback's send buffer holds it; EAGAIN is
// retried at once).
func (c *spinConn) send(req []byte) error {
	c.in, c.hdrEnd, c.size = c.in[:0], 0, 0
	for len(req) > 0 {
		n, err := syscall.Write(c.fd, req)
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("spin paced: write: %w", err)
		}
		req = req[n:]
	}
	return nil
}

var (
	crlf2         = []byte("\r\n\r\n")
	contentLength = []byte("\r\nContent-Length:")
)

// read takes what arrived; done once the answer is whole.
func (c *spinConn) read() (bool, error) {
	for {
		if len(c.in) == cap(c.in) {
			c.in = append(c.in, 0)[:len(c.in)]
		}
		n, err := syscall.Read(c.fd, c.in[len(c.in):cap(c.in)])
		if errors.Is(err, syscall.EAGAIN) {
			break
		}
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("spin paced: read: %w", err)
		}
		if n == 0 {
			return false, errors.New("spin paced: the server closed a connection")
		}
		c.in = c.in[:len(c.in)+n]
	}
	if c.hdrEnd == 0 {
		i := bytes.Index(c.in, crlf2)
		if i < 0 {
			return false, nil
		}
		c.hdrEnd = i + len(crlf2)
		cl := 0
		head := c.in[:c.hdrEnd]
		if j := bytes.Index(head, contentLength); j >= 0 {
			v := head[j+len(contentLength):]
			v = v[:bytes.IndexByte(v, '\r')]
			for _, b := range bytes.TrimSpace(v) {
				if b < '0' || b > '9' {
					return false, fmt.Errorf("spin paced: bad content-length %q", v)
				}
				cl = cl*10 + int(b-'0')
			}
		}
		c.size = c.hdrEnd + cl
	}
	if len(c.in) > c.size {
		return false, fmt.Errorf("spin paced: %d bytes past the answer", len(c.in)-c.size)
	}
	return len(c.in) == c.size, nil
}

// answered checks a whole answer as routeWorker does and closes its
// decision.
func (c *spinConn) answered() error {
	head := c.in[:c.hdrEnd]
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) {
		return fmt.Errorf("spin paced: answer %.200q", c.in)
	}
	backend := headerValue(head, hdrBackendLine)
	if len(backend) == 0 {
		return fmt.Errorf("spin paced: an answer without a backend: %.200q", head)
	}
	return c.fb.done(headerValue(head, hdrDecisionLine), headerValue(head, hdrServerLine))
}

// The answer's header lines as fasthttp writes them (canonical case).
var (
	hdrBackendLine  = []byte("\r\n" + contract.HdrBackend + ":")
	hdrDecisionLine = []byte("\r\n" + contract.HdrDecision + ":")
	hdrServerLine   = []byte("\r\n" + contract.HdrServer + ":")
)

// headerValue is the value of the header line starting with name (with
// its CRLF and colon) in an HTTP head; nil when absent.
func headerValue(head, name []byte) []byte {
	i := bytes.Index(head, name)
	if i < 0 {
		return nil
	}
	v := head[i+len(name):]
	if j := bytes.IndexByte(v, '\r'); j >= 0 {
		v = v[:j]
	}
	return bytes.TrimSpace(v)
}
