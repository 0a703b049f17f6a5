package haproxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route/contract"

	"github.com/rs/zerolog"
)

// Live tests run the rendered config and Lua in a real HAProxy against a
// fake route service and plain HTTP backends. They skip without haproxy.

// replica is a fake backend that says who served.
type replica struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64
	// last request seen: headers (for header stripping checks), body, and
	// how it was framed (Content-Length, -1 for chunked)
	mu       sync.Mutex
	last     http.Header
	lastBody []byte
	lastCL   int64
}

func newReplica(t *testing.T, name string) *replica {
	t.Helper()
	r := &replica{name: name}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/health" {
			return
		}
		b, _ := io.ReadAll(req.Body)
		r.hits.Add(1)
		r.mu.Lock()
		r.last = req.Header.Clone()
		r.lastBody, r.lastCL = b, req.ContentLength
		r.mu.Unlock()
		w.Header().Set("X-Replica", name)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *replica) addr() string { return r.srv.Listener.Addr().String() }

// routeCall is what the fake route service received.
type routeCall struct {
	header http.Header
	body   []byte
}

// fakeRoute answers /internal/route with whatever answer returns.
type fakeRoute struct {
	srv    *httptest.Server
	calls  atomic.Int64
	mu     sync.Mutex
	last   routeCall
	answer atomic.Pointer[func(w http.ResponseWriter, c routeCall)]
}

func newFakeRoute(t *testing.T) *fakeRoute {
	t.Helper()
	f := &fakeRoute{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == contract.PathHealthz {
			return
		}
		b, _ := io.ReadAll(req.Body)
		c := routeCall{header: req.Header.Clone(), body: b}
		f.calls.Add(1)
		f.mu.Lock()
		f.last = c
		f.mu.Unlock()
		if fn := f.answer.Load(); fn != nil {
			(*fn)(w, c)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRoute) set(fn func(w http.ResponseWriter, c routeCall)) { f.answer.Store(&fn) }

func (f *fakeRoute) lastCall() routeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// verdict answers like turnout: 200 with the decision headers.
func verdict(pool, server, fallbacks, id string) func(w http.ResponseWriter, c routeCall) {
	return func(w http.ResponseWriter, _ routeCall) {
		h := w.Header()
		h.Set(contract.HdrServer, server)
		h.Set(contract.HdrPool, pool)
		h.Set(contract.HdrFallbacks, fallbacks)
		h.Set(contract.HdrDecision, id)
		w.WriteHeader(http.StatusOK)
	}
}

func needHAProxy(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("live HAProxy test skipped in -short mode")
	}
	p, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed (apt-get install -y haproxy); live test skipped")
	}
	return p
}

// liveEnv is a running HAProxy with its rendered directory.
type liveEnv struct {
	dir, url string
	cfg      *config.Config
	cmd      *exec.Cmd
	log      *os.File
}

type liveOpts struct {
	failMode string
	routeURL string // host:port of the route service
	replicas []*replica
	// prefill, when set, makes the deployment prefill/decode: these are the
	// prefill pool, replicas the decode pool (backend m_decode).
	prefill   []*replica
	extra     string // YAML appended under proxy:
	syslog    string
	l7Retries bool
}

func liveConfig(t *testing.T, o liveOpts, dir string, listen int) *config.Config {
	t.Helper()
	var eps strings.Builder
	pool := func(role string, reps []*replica) {
		fmt.Fprintf(&eps, "      - role: %s\n        endpoints:\n", role)
		for _, r := range reps {
			fmt.Fprintf(&eps, "          - {name: %s, address: %q}\n", r.name, r.addr())
		}
	}
	if len(o.prefill) > 0 {
		pool(config.RolePrefill, o.prefill)
		pool(config.RoleDecode, o.replicas)
	} else {
		pool(config.RoleMixed, o.replicas)
	}
	fm := o.failMode
	if fm == "" {
		fm = config.FailOpen
	}
	feedback := ""
	if o.syslog != "" {
		feedback = "feedback: {syslog: " + o.syslog + "}\n"
	}
	y := fmt.Sprintf(`listen: 127.0.0.1:1
session_headers: [x-session-id]
max_body: 4096
fallbacks: 2
%shealth: {interval: 200ms, fails: 1, timeout: 200ms}
proxy:
  route_addrs: [%q]
  fail_mode: %s
  route_timeout: 300ms
  breaker_failures: 2
  breaker_cooldown: 60s
%s
haproxy: {listen: "127.0.0.1:%d", dir: %q, nbthread: 1}
deployments:
  - name: m
    models: [m1]
    pools:
%s`, feedback, o.routeURL, fm, o.extra, listen, dir, eps.String())
	cfg, err := config.ParseConfig([]byte(y))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return cfg
}

func startLive(t *testing.T, o liveOpts) *liveEnv {
	t.Helper()
	bin := needHAProxy(t)
	dir := t.TempDir()
	port := freeport.Port(t)
	cfg := liveConfig(t, o, dir, port)
	cfg.HAProxy.L7Retries = o.l7Retries
	out, err := Render(cfg, RenderOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFiles(dir, out.Files()); err != nil {
		t.Fatal(err)
	}
	e := &liveEnv{dir: dir, url: fmt.Sprintf("http://127.0.0.1:%d", port), cfg: cfg}
	e.log, err = os.Create(filepath.Join(dir, "haproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	e.cmd = exec.Command(bin, "-f", filepath.Join(dir, ConfigFile))
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = e.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = e.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(e.log.Name())
			t.Logf("haproxy log:\n%s", b)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		rt, err := dialRuntime(context.Background(), filepath.Join(dir, DefaultSocketName))
		if err == nil {
			// wait for the health checks to see the servers up
			if upCount(t, rt) == len(o.replicas)+len(o.prefill) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return e
}

func upCount(t *testing.T, rt RuntimeClient) int {
	t.Helper()
	out, err := rt.ExecuteRaw("show stat")
	if err != nil {
		return -1
	}
	n := 0
	for _, o := range out {
		for line := range strings.Lines(o) {
			f := strings.Split(line, ",")
			if len(f) > 18 && f[0] != RouteProxy && f[0] != RoutePDProxy && f[1] != "FRONTEND" && f[1] != "BACKEND" && f[17] == "UP" {
				n++
			}
		}
	}
	return n
}

func (e *liveEnv) runtime(t *testing.T) RuntimeClient {
	t.Helper()
	rt, err := dialRuntime(context.Background(), filepath.Join(e.dir, DefaultSocketName))
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

type answer struct {
	status int
	header http.Header
	body   string
	dur    time.Duration
}

func (e *liveEnv) post(t *testing.T, path, body string, hdr map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = []string{v} // keep the client's spelling
	}
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: string(b), dur: time.Since(start)}
}

func testLogger(t *testing.T) *zerolog.Logger {
	l := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	return &l
}
