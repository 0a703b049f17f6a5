//go:build e2e

// Package e2e holds end-to-end tests: the real turnout binary, real proxies
// (HAProxy, later nginx) and mock vLLM replicas, all on loopback ports picked
// at run time. Run with: go test -tags e2e ./test/
//
// This file is the reusable harness: free ports, the turnout binary built
// once, processes with captured logs (printed when a test fails), readiness
// waits, in-process mock replicas, HAProxy in master-worker mode with an
// admin socket.
package e2e

import (
	"bufio"
	"bytes"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/freeport"
)

// FreePort returns a loopback port that was free a moment ago (freeport.Port).
func FreePort(t testing.TB) int { return freeport.Port(t) }

// FreeAddr returns "127.0.0.1:PORT" for a free TCP port.
func FreeAddr(t testing.TB) string { return freeport.Addr(t) }

// FreeUDPAddr returns "127.0.0.1:PORT" for a free UDP port.
func FreeUDPAddr(t testing.TB) string { return FreeAddr(t) }

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
	buildDir  string
)

// TurnoutBin returns $TURNOUT_BIN when set (make test-e2e builds it), else
// builds ./cmd/turnout once per test binary run.
func TurnoutBin(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if b := os.Getenv("TURNOUT_BIN"); b != "" {
			buildBin = b
			return
		}
		buildDir, buildErr = os.MkdirTemp("", "turnout-e2e-bin-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "turnout")
		cmd := exec.Command("go", "build", "-o", buildBin, "./cmd/turnout")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/turnout: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

var (
	labOnce sync.Once
	labBin  string
	labErr  error
)

// LabBin returns the turnout-lab binary (mock replicas as processes):
// $TURNOUT_LAB_BIN when set, else turnout-lab next to $TURNOUT_BIN (make
// build puts both in bin/), else one built from ./cmd/turnout-lab once per
// test binary run.
func LabBin(t testing.TB) string {
	t.Helper()
	labOnce.Do(func() {
		if b := os.Getenv("TURNOUT_LAB_BIN"); b != "" {
			labBin = b
			return
		}
		if b := os.Getenv("TURNOUT_BIN"); b != "" {
			if sib := filepath.Join(filepath.Dir(b), "turnout-lab"); fileExists(sib) {
				labBin = sib
				return
			}
		}
		dir, err := os.MkdirTemp("", "turnout-e2e-lab-")
		if err != nil {
			labErr = err
			return
		}
		labDir = dir
		labBin = filepath.Join(dir, "turnout-lab")
		cmd := exec.Command("go", "build", "-o", labBin, "./cmd/turnout-lab")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			labErr = fmt.Errorf("go build ./cmd/turnout-lab: %w\n%s", err, out)
		}
	})
	if labErr != nil {
		t.Fatal(labErr)
	}
	return labBin
}

// labDir is LabBin's build directory, removed by TestMain.
var labDir string

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// repoRoot is the module root: tests run in test/.
func repoRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return wd
}

// TestMain removes the built binary after the run.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if labDir != "" {
		_ = os.RemoveAll(labDir)
	}
	if npmDir != "" {
		_ = os.RemoveAll(npmDir)
	}
	os.Exit(code)
}

// Proc is a child process whose output goes to a log file in t.TempDir().
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string
	done chan struct{}
	err  error
}

// StartProc starts bin with args. The process is stopped (SIGTERM, then
// SIGKILL after 5 s) at cleanup, and its log is printed if the test failed.
func StartProc(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	return StartCmd(t, name, exec.Command(bin, args...))
}

// StartCmd is StartProc for a prepared command (its own user, environment
// or directory); its output goes to the log.
func StartCmd(t testing.TB, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Name: name, Log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	p.Cmd = cmd
	p.Cmd.Stdout, p.Cmd.Stderr = f, f
	if err := p.Cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.Log)
			if len(b) > 16<<10 {
				b = append([]byte("...\n"), b[len(b)-16<<10:]...)
			}
			t.Logf("---- %s log (%s) ----\n%s", name, p.Log, b)
		}
	})
	return p
}

// Stop ends the process (idempotent) and waits for it.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Eventually polls cond every 20 ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitHTTP waits until GET url answers 2xx.
func WaitHTTP(t testing.TB, url string, timeout time.Duration) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	Eventually(t, timeout, "GET "+url, func() bool {
		res, err := c.Get(url)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode/100 == 2
	})
}

// Mock is an in-process mock vLLM replica.
type Mock struct {
	*mock.Server
	Name, Addr string
}

// StartMock starts a replica named name on a free loopback port; edit
// adjusts its config (nil = defaults with fast timings).
func StartMock(t testing.TB, name string, edit func(*mock.Config)) *Mock {
	t.Helper()
	return StartMockAt(t, name, "127.0.0.1:0", edit)
}

// StartMockAt is StartMock on addr (a replica restarted in place).
func StartMockAt(t testing.TB, name, addr string, edit func(*mock.Config)) *Mock {
	t.Helper()
	cfg := mock.DefaultConfig()
	cfg.Name = name
	cfg.TimeScale = 0.01 // 20 ms TTFT -> 0.2 ms: tests should not wait on the model
	if edit != nil {
		edit(&cfg)
	}
	l := zerolog.Nop()
	s, err := mock.New(cfg, &l)
	if err != nil {
		t.Fatal(err)
	}
	url, err := s.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &Mock{Server: s, Name: name, Addr: strings.TrimPrefix(url, "http://")}
}

// HAProxy is a master-worker HAProxy with an admin socket.
type HAProxy struct {
	*Proc
	Dir, Socket, URL string
}

// NeedHAProxy skips the test when haproxy is not installed.
func NeedHAProxy(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy is not installed (apt-get install -y haproxy): skipping HAProxy end-to-end test")
	}
	return bin
}

// serverIDs are the HAProxy server ids (backend/name) of ms in backend.
func serverIDs(backend string, ms []*Mock) []string {
	var ids []string
	for _, m := range ms {
		ids = append(ids, backend+"/"+m.Name)
	}
	return ids
}

// StartRenderedHAProxy waits for a turnout started with --haproxy-dir dir
// to write dir/haproxy.cfg, then starts HAProxy on it (StartHAProxy).
func StartRenderedHAProxy(t testing.TB, dir, listen string) *HAProxy {
	t.Helper()
	Eventually(t, 20*time.Second, "turnout to write haproxy.cfg", func() bool {
		_, err := os.Stat(filepath.Join(dir, "haproxy.cfg"))
		return err == nil
	})
	return StartHAProxy(t, dir, listen)
}

// StartHAProxy runs haproxy on dir/haproxy.cfg (master-worker is in the
// rendered global section) and waits until its admin socket answers.
func StartHAProxy(t testing.TB, dir, listen string) *HAProxy {
	t.Helper()
	bin := NeedHAProxy(t)
	h := &HAProxy{Dir: dir, Socket: filepath.Join(dir, "admin.sock"), URL: "http://" + listen}
	h.Proc = StartProc(t, "haproxy", bin, "-f", filepath.Join(dir, "haproxy.cfg"))
	Eventually(t, 10*time.Second, "haproxy admin socket", func() bool {
		if h.Exited() {
			t.Fatalf("haproxy exited: %v", h.err)
		}
		_, err := h.Cmd1(t, "show info")
		return err == nil
	})
	return h
}

// Cmd1 runs one admin socket command and reads the answer until EOF.
func (h *HAProxy) Cmd1(t testing.TB, cmd string) (string, error) {
	c, err := net.DialTimeout("unix", h.Socket, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// Info returns "show info" as a map.
func (h *HAProxy) Info(t testing.TB) map[string]string {
	t.Helper()
	out, err := h.Cmd1(t, "show info")
	if err != nil {
		t.Fatalf("show info: %v", err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ": "); ok {
			m[k] = v
		}
	}
	return m
}

// ServerStatus returns backend/server -> status (UP, DOWN, MAINT...) from "show stat".
func (h *HAProxy) ServerStatus(t testing.TB) map[string]string {
	t.Helper()
	out, err := h.Cmd1(t, "show stat")
	if err != nil {
		t.Fatalf("show stat: %v", err)
	}
	m := map[string]string{}
	for line := range strings.Lines(out) {
		f := strings.Split(line, ",")
		if len(f) < 18 || strings.HasPrefix(line, "#") || f[1] == "FRONTEND" || f[1] == "BACKEND" {
			continue
		}
		m[f[0]+"/"+f[1]] = f[17]
	}
	return m
}

// WaitServersUp waits until every listed backend/server is UP.
func (h *HAProxy) WaitServersUp(t testing.TB, ids ...string) {
	t.Helper()
	Eventually(t, 10*time.Second, "servers up: "+strings.Join(ids, ","), func() bool {
		st := h.ServerStatus(t)
		for _, id := range ids {
			if st[id] != "UP" {
				return false
			}
		}
		return true
	})
}

// Turnout is a running `turnout serve`.
type Turnout struct {
	*Proc
	ConfigPath, URL string
}

// StartTurnout writes cfgYAML to a file and runs `turnout serve` on it with
// extra flags, then waits for /healthz.
func StartTurnout(t testing.TB, listen, cfgYAML string, extra ...string) *Turnout {
	t.Helper()
	path := filepath.Join(t.TempDir(), "turnout.yaml")
	if err := os.WriteFile(path, []byte(cfgYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--config", path}, extra...)
	tu := &Turnout{ConfigPath: path, URL: "http://" + listen}
	tu.Proc = StartProc(t, "turnout", TurnoutBin(t), args...)
	WaitHTTP(t, tu.URL+"/healthz", 10*time.Second)
	return tu
}

// FeedbackToken is the token turnout keeps beside its config when the
// config sets none (feedback.token_file's default), "" when there is none.
func (tu *Turnout) FeedbackToken(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(tu.ConfigPath), config.DefaultFeedbackTokenFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Rewrite replaces the config file atomically (turnout watches it).
func (tu *Turnout) Rewrite(t testing.TB, cfgYAML string) {
	t.Helper()
	tmp := tu.ConfigPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfgYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, tu.ConfigPath); err != nil {
		t.Fatal(err)
	}
}

// Metric sums the values of a Prometheus metric from url (all label sets
// whose label text contains every filter).
func Metric(t testing.TB, url, name string, filters ...string) (float64, error) {
	res, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	found := false
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, f := range filters {
			ok = ok && strings.Contains(line, f)
		}
		if !ok {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, errors.New("metric " + name + " not found")
	}
	return sum, nil
}

// Response is a finished HTTP exchange.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	Dur    time.Duration
}

// Post sends a JSON POST with headers set exactly as spelled.
func Post(ctx context.Context, c *http.Client, url string, body []byte, hdr map[string]string) (*Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = []string{v}
	}
	start := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &Response{Status: res.StatusCode, Header: res.Header, Body: b, Dur: time.Since(start)}, nil
}
