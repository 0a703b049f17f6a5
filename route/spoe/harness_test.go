package spoe

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/feedback"
	"github.com/turnout/turnout/route/httpapi"
)

// Live-test harness: tiny fasthttp replicas that answer with their name,
// turnout (route.Decider + this package's agent) in process, and a real
// HAProxy built from templates/haproxy-spoe.snippets.tmpl.

// replica answers every request with its name (X-Replica and the body).
type replica struct {
	name, addr string
	hits       atomic.Int64
	lastLen    atomic.Int64 // body length of the last request
	srv        *fasthttp.Server
	ln         net.Listener
	mu         sync.Mutex
	stopped    bool
}

func startReplica(t testing.TB, name string) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, addr: ln.Addr().String(), ln: ln}
	body := []byte(`{"replica":"` + name + `"}`)
	r.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) != "/health" {
				r.hits.Add(1)
				r.lastLen.Store(int64(len(ctx.PostBody())))
			}
			ctx.Response.Header.Set("X-Replica", name)
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		},
		MaxRequestBodySize:    8 << 20,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
	}
	go r.srv.Serve(ln) //nolint:errcheck // ends when stopped
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.stopped = true
		_ = r.srv.Shutdown()
	}
}

// turnoutProc is turnout in process: the decision server and its agent.
type turnoutProc struct {
	srv       *route.Decider
	agent     *Agent
	spoeAddr  string
	cancel    context.CancelFunc
	done      chan error
	feedback  context.CancelFunc
	httpAddr  string
	httpClose func()
}

// startTurnout starts turnout; withAgent false leaves spoeAddr unanswered.
func startTurnout(t testing.TB, yaml, spoeAddr string, withAgent bool) *turnoutProc {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	srv, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := &turnoutProc{srv: srv, spoeAddr: spoeAddr}
	fctx, fcancel := context.WithCancel(context.Background())
	p.feedback = fcancel
	if cfg.Feedback.Syslog != "" {
		fb := feedback.New(srv)
		go func() { _ = fb.Listen(fctx, cfg.Feedback.Syslog) }()
	}
	if withAgent {
		p.startAgent(t)
	}
	t.Cleanup(func() {
		p.stopAgent()
		fcancel()
		if p.httpClose != nil {
			p.httpClose()
		}
		srv.Close()
	})
	return p
}

// startAgent (re)starts the SPOE agent on spoeAddr.
func (p *turnoutProc) startAgent(t testing.TB) {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port may linger briefly after a stop
		if ln, err = net.Listen("tcp", p.spoeAddr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("agent listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.agent = New(p.srv, Options{})
	p.cancel, p.done = cancel, make(chan error, 1)
	go func() { p.done <- p.agent.Serve(ctx, ln) }()
}

// serveUnix also serves the agent on a unix socket until the test ends.
func (p *turnoutProc) serveUnix(t testing.TB, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = New(p.srv, Options{}).Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (p *turnoutProc) stopAgent() {
	if p.cancel != nil {
		p.cancel()
		<-p.done
		p.cancel = nil
	}
}

// serveHTTP also serves turnout's HTTP API (for the Lua comparison).
func (p *turnoutProc) serveHTTP(t testing.TB, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hs := httpapi.New(p.srv).NewHTTPServer()
	go hs.Serve(ln) //nolint:errcheck // ends at Shutdown
	p.httpAddr, p.httpClose = addr, func() { _ = hs.Shutdown() }
}

// cfgData feeds testdata/haproxy.cfg.tmpl and the snippets.
type cfgData struct {
	Generator, Dir, Listen, Syslog, DefaultBackend string
	Nbthread, BufSize                              int
	RetryOn                                        bool
	ServerVars                                     []string
	Backends                                       []cfgBackend
	SPOE                                           *spoeData
	PD                                             bool // the live tests run no prefill/decode
	// RouteBody is route_body: the SPOE message carries that much body.
	RouteBody int
}

type cfgBackend struct {
	Name    string
	Servers []cfgServer
}

type cfgServer struct {
	Name, Addr string
	Backup     bool
}

// spoeData is what the renderer will have to provide (see the snippets' header).
type spoeData struct {
	Backend, RelayBackend                string
	Conf                                 string
	Servers                              []cfgServer
	HelloMs, IdleMs, ServerMs, TimeoutMs int64
	PDTimeoutMs                          int64
	PDVar, DeferArg, SentArg             string
	BreakerFails, CooldownMs             int64
	MaxFrameSize                         int
	FailClosed                           bool
	Fallbacks, Vars                      []string
	Contract                             contract.SPOEConfig
}

func newSPOEData(dir, agentAddr string, fallbacks int, failClosed bool) *spoeData {
	return &spoeData{
		Backend:      "turnout_spoe",
		RelayBackend: "turnout_relay",
		Conf:         filepath.Join(dir, "turnout-spoe.conf"),
		Servers:      []cfgServer{{Name: "spoe0", Addr: agentAddr}},
		HelloMs:      500, IdleMs: 30000, ServerMs: 60000, TimeoutMs: 500, PDTimeoutMs: 11000, PDVar: contract.SPOEVarPD, DeferArg: contract.SPOEArgDeferPD,
		SentArg: contract.SPOEArgSent, BreakerFails: 3, CooldownMs: 5000,
		FailClosed: failClosed,
		Fallbacks:  contract.SPOEFallbackVars(fallbacks),
		Vars:       contract.SPOEVarNames(fallbacks),
		Contract:   mustSPOEConfig(),
	}
}

func mustSPOEConfig() contract.SPOEConfig {
	c, err := contract.NewSPOEConfig()
	if err != nil {
		panic(err)
	}
	return c
}

func serverVars(fallbacks int) []string {
	v := []string{contract.VerdictFieldNamed("server").HAProxyVar}
	for i := 1; i <= fallbacks; i++ {
		v = append(v, fmt.Sprintf("%s%d", contract.VerdictFieldNamed("fallbacks").HAProxyVar, i))
	}
	return v
}

// renderTestConfig renders haproxy.cfg (and the SPOE file when d.SPOE is set).
func renderTestConfig(t testing.TB, d *cfgData) {
	t.Helper()
	tpl, err := template.New("haproxy.cfg.tmpl").Option("missingkey=error").ParseFiles(
		"testdata/haproxy.cfg.tmpl", "../../templates/haproxy-spoe.snippets.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	var cfg bytes.Buffer
	if err := tpl.ExecuteTemplate(&cfg, "haproxy.cfg.tmpl", d); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(d.Dir, "haproxy.cfg"), cfg.Bytes())
	if d.SPOE != nil {
		var sc bytes.Buffer
		if err := tpl.ExecuteTemplate(&sc, "spoe-conf", d); err != nil {
			t.Fatal(err)
		}
		write(t, d.SPOE.Conf, sc.Bytes())
	}
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// haproxyProc is a foreground HAProxy started by a test.
type haproxyProc struct {
	cmd *exec.Cmd
	out *bytes.Buffer
}

func needHAProxy(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed")
	}
	return bin
}

// startHAProxy checks and starts cfg, and waits until listen accepts.
func startHAProxy(t testing.TB, cfg, listen string) *haproxyProc {
	t.Helper()
	bin := needHAProxy(t)
	if out, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput(); err != nil {
		b, _ := os.ReadFile(cfg)
		t.Fatalf("haproxy -c: %v\n%s\n--- config ---\n%s", err, out, b)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &haproxyProc{cmd: cmd, out: &out}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy output:\n%s", out.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy never listened on %s: %v\n%s", listen, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// answer is one HTTP exchange through HAProxy.
type answer struct {
	status  int
	body    string
	replica string
	reason  string
	dur     time.Duration
}

var client = &fasthttp.Client{MaxConnsPerHost: 64, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}

func post(t testing.TB, addr, path, body string, hdrs ...string) answer {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	req.Header.DisableNormalizing()
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	for i := 0; i+1 < len(hdrs); i += 2 {
		req.Header.Set(hdrs[i], hdrs[i+1])
	}
	req.SetBodyString(body)
	start := time.Now()
	if err := client.Do(req, resp); err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return answer{
		status:  resp.StatusCode(),
		body:    string(resp.Body()),
		replica: string(resp.Header.Peek("X-Replica")),
		reason:  string(resp.Header.Peek(contract.HdrReason)),
		dur:     time.Since(start),
	}
}

// direct asks turnout itself (the HTTP handler), closing the decision.
func direct(t testing.TB, srv *route.Decider, body string, hdrs ...string) *fasthttp.RequestCtx {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathRoute)
	ctx.Request.Header.SetMethod("POST")
	for i := 0; i+1 < len(hdrs); i += 2 {
		ctx.Request.Header.Set(hdrs[i], hdrs[i+1])
	}
	ctx.Request.SetBodyString(body)
	httpapi.New(srv).Handler(&ctx)
	var id uint64
	if _, err := fmt.Sscanf(string(ctx.Response.Header.Peek(contract.HdrDecision)), "%x", &id); err == nil {
		srv.Ledger().Complete(id)
	}
	return &ctx
}

// eventually retries f until it returns nil or d passes.
func eventually(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metric reads one line of turnout's /metrics.
func metric(srv *route.Decider, prefix string) string {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(contract.PathMetrics)
	httpapi.New(srv).Handler(&ctx)
	for line := range strings.SplitSeq(string(ctx.Response.Body()), "\n") {
		if strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(line, prefix))
		}
	}
	return ""
}
