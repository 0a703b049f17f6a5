package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// freePort asks the kernel for a free loopback port. Another process could
// take it before we bind it, which the readiness checks then report.
func freePort(network string) (int, error) {
	if network == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free udp port: %w", err)
		}
		defer pc.Close()
		return pc.LocalAddr().(*net.UDPAddr).Port, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free tcp port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func freeAddr() (string, error) {
	p, err := freePort("tcp")
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// turnoutAddrs picks one turnout's listen address and its feedback
// syslog address (UDP): feedback is on by default, and two turnouts on
// the default address would not both start.
func turnoutAddrs() (listen, syslog string, err error) {
	if listen, err = freeAddr(); err != nil {
		return "", "", err
	}
	p, err := freePort("udp")
	if err != nil {
		return "", "", err
	}
	return listen, "127.0.0.1:" + strconv.Itoa(p), nil
}

// startupWait bounds a process's start, up to its first right answer: on a
// shared 2-core box a start can take tens of seconds, and the wait ends
// as soon as the answer comes.
const startupWait = time.Minute

// waitHTTP polls url until it answers want, the process dies or timeout.
func waitHTTP(ctx context.Context, p *proc, url string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	var last error
	for time.Now().Before(deadline) {
		if p != nil && p.Exited() {
			return fmt.Errorf("%s exited during startup: %v\n%s", p.name, p.Err(), p.logTail())
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("wait %s: %w", url, err)
		}
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait %s: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	msg := ""
	if p != nil {
		msg = "\n" + p.logTail()
	}
	return fmt.Errorf("wait %s: %w after %v (last: %v)%s", url, errNotReady, timeout, last, msg)
}

// errNotReady marks a component that did not come up.
var errNotReady = errors.New("not ready")

// getText fetches url's body.
func getText(ctx context.Context, url string) (string, error) {
	return getTextWithin(ctx, url, 5*time.Second)
}

// getTextWithin is getText with another timeout.
func getTextWithin(ctx context.Context, url string, timeout time.Duration) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("get %s: status %d", url, resp.StatusCode)
	}
	return string(b), nil
}

// PlainHAProxyOptions describe an HAProxy that balances on its own.
type PlainHAProxyOptions struct {
	Dir     string
	Listen  string
	Balance string // roundrobin or leastconn
	Servers []Endpoint
	// BufSize sets tune.bufsize (0: HAProxy's default, the honest baseline;
	// >0: the equal-buffer row).
	BufSize int
}

// PlainHAProxyConfig renders the "HAProxy alone" baseline as an operator
// runs it without turnout: HAProxy's default buffers and keep-alive, the
// streaming setting SSE needs (http-no-delay) and the rendered timeouts, no
// body buffering, HAProxy's own balance algorithm.
func PlainHAProxyConfig(o PlainHAProxyOptions) []byte {
	var b strings.Builder
	b.WriteString("# HAProxy alone (turnout-lab bench baseline).\nglobal\n")
	fmt.Fprintf(&b, "    pidfile %s/haproxy.pid\n    maxconn 4096\n", o.Dir)
	if o.BufSize > 0 {
		fmt.Fprintf(&b, "    tune.bufsize %d\n", o.BufSize)
	}
	b.WriteString(`
defaults
    mode http
    option http-no-delay
    timeout connect 2000ms
    timeout client 600000ms
    timeout server 600000ms
    timeout http-request 30s
    timeout http-keep-alive 60s
    timeout queue 2000ms
    timeout check 1000ms

frontend bench
`)
	fmt.Fprintf(&b, "    bind %s\n    default_backend replicas\n\nbackend replicas\n    balance %s\n", o.Listen, o.Balance)
	b.WriteString("    option httpchk GET /health\n    http-check expect status 200\n")
	for _, s := range o.Servers {
		fmt.Fprintf(&b, "    server %s %s check inter 5000ms fall 2 rise 1\n", s.Name, s.Address)
	}
	return []byte(b.String())
}
