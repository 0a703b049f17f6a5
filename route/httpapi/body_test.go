package httpapi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/netlimit"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
)

// serveHTTP runs s's real fasthttp server (the one `turnout serve` uses) on
// a loopback port.
func serveHTTP(t *testing.T, s *testServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := s.NewHTTPServer()
	lln := netlimit.Listener(ln, s.Snapshot().Config.Limits.MaxConns, OverloadedAnswer(), nil)
	go func() { _ = hs.Serve(lln) }()
	t.Cleanup(func() { _ = hs.Shutdown() })
	return ln.Addr().String()
}

const limitsConfig = `
health: {disable: true}
max_body: 65536
limits: {read_timeout: 1500ms, body_idle_timeout: 300ms, max_buffered_bytes: %d, max_header_bytes: 16384}
deployments:
  - name: llama
    policy: {name: session-hash}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
`

// rawRequest sends head (request line and headers, without the blank line)
// and body, and returns the response (nil on a connection error).
func rawRequest(t *testing.T, addr, head string, body []byte) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write(body)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body = io.NopCloser(strings.NewReader(string(b)))
	return res
}

func readAll(res *http.Response) string { b, _ := io.ReadAll(res.Body); return string(b) }

// Issue 16 finding 2: connections announcing a large body and sending it
// slowly must not make turnout reserve the announced length, and each is
// answered (408) once a chunk is late.
func TestSlowBodiesDoNotReserveMemory(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(limitsConfig, 64<<20))
	addr := serveHTTP(t, s)
	const conns, announced = 100, 2 << 20
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var cs []net.Conn
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":", contract.PathRoute, announced)
		cs = append(cs, c)
	}
	time.Sleep(200 * time.Millisecond) // the server has read every head
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	grown := int64(during.HeapInuse) - int64(before.HeapInuse)
	if limit := int64(conns * 64 << 10); grown > limit {
		t.Errorf("heap grew %d MiB with %d slow connections announcing %d MiB each; want < %d MiB (no up-front reservation)",
			grown>>20, conns, announced>>20, limit>>20)
	}
	for i, c := range cs {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("conn %d: no answer to a stalled body: %v", i, err)
		}
		if res.StatusCode != 408 || res.Header.Get(contract.HdrReason) != contract.ReasonReadTimeout {
			t.Fatalf("conn %d: %d %q, want 408 %s", i, res.StatusCode, res.Header.Get(contract.HdrReason), contract.ReasonReadTimeout)
		}
	}
}

// A body whose chunks stop coming is answered after body_idle_timeout, well
// before read_timeout.
func TestBodyChunkTimeout(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(limitsConfig, 64<<20))
	addr := serveHTTP(t, s)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// More than fasthttp's 8 KiB pre-read, so turnout's own reader waits.
	body := strings.Repeat(" ", 9000)
	start := time.Now()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 60000\r\n\r\n%s", contract.PathRoute, body)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 408 {
		t.Fatalf("status %d, want 408", res.StatusCode)
	}
	if d := time.Since(start); d > 1200*time.Millisecond {
		t.Errorf("answered after %v: the per-chunk timeout (300ms) did not apply", d)
	}
}

// The buffers of in-flight bodies share limits.max_buffered_bytes: past it
// a request is answered 503 overloaded (the proxies fail open on it).
func TestBodyBudget(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(limitsConfig, 65536))
	addr := serveHTTP(t, s)
	// A holds 32 KiB of buffer: it sent 20 KiB of a 64 KiB body.
	a, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	fmt.Fprintf(a, "POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 65536\r\n\r\n%s", contract.PathRoute, strings.Repeat(" ", 20000))
	deadline := time.Now().Add(2 * time.Second)
	for s.budget.used.Load() < 32<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("budget in use %d, want 32 KiB", s.budget.used.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	big := `{"model":"llama","x":"` + strings.Repeat("y", 60000) + `"}`
	res := rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d", contract.PathRoute, len(big)), []byte(big))
	if res.StatusCode != 503 || res.Header.Get(contract.HdrReason) != contract.ReasonOverloaded {
		t.Fatalf("over budget: %d %q %s, want 503 %s", res.StatusCode, res.Header.Get(contract.HdrReason), readAll(res), contract.ReasonOverloaded)
	}
	// A small body still fits.
	small := `{"model":"llama"}`
	res = rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d", contract.PathRoute, len(small)), []byte(small))
	if res.StatusCode != 200 || res.Header.Get(contract.HdrServer) == "" {
		t.Fatalf("small body: %d %s", res.StatusCode, readAll(res))
	}
	a.Close()
	deadline = time.Now().Add(3 * time.Second)
	for s.budget.used.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("budget not returned: %d in use", s.budget.used.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Bodies beyond max_body are routed on their first max_body bytes (marked
// truncated), chunked ones too; far larger ones get 413. The connection
// stays usable after a cut body.
func TestStreamedBodies(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(limitsConfig, 64<<20))
	addr := serveHTTP(t, s)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	long := `{"model":"llama","pad":"` + strings.Repeat("p", 100000) + `"}`
	for i := range 2 {
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: t\r\nX-Session-Id: s1\r\nContent-Length: %d\r\n\r\n%s", contract.PathRoute, len(long), long)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on one connection: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		if res.StatusCode != 200 || res.Header.Get(contract.HdrServer) == "" {
			t.Fatalf("request %d: %d", i, res.StatusCode)
		}
	}
	chunked := "POST " + contract.PathRoute + " HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"9\r\n{\"model\":\r\n8\r\n\"llama\"}\r\n0\r\n\r\n"
	if _, err := io.WriteString(c, chunked); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("chunked: %v %v", res, err)
	}
	huge := hardBodyLimit(65536) + 1
	res = rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d", contract.PathRoute, huge), make([]byte, 9000))
	if res.StatusCode != 413 || res.Header.Get(contract.HdrReason) != contract.ReasonBodyTooLarge {
		t.Fatalf("huge: %d %q", res.StatusCode, res.Header.Get(contract.HdrReason))
	}
}

// Issue 16 finding 3: routing headers up to limits.max_header_bytes are
// read; a larger head is answered 431 header_too_large without fasthttp's
// own text (which the proxies used to relay as a client 400).
func TestLargeHeaders(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(limitsConfig, 64<<20))
	addr := serveHTTP(t, s)
	body := `{"model":"llama"}`
	session := strings.Repeat("s", 12<<10)
	res := rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nX-Session-Id: %s\r\nContent-Length: %d", contract.PathRoute, session, len(body)), []byte(body))
	if res.StatusCode != 200 || res.Header.Get(contract.HdrServer) == "" {
		t.Fatalf("12 KiB session header: %d %s", res.StatusCode, readAll(res))
	}
	session = strings.Repeat("s", 20<<10)
	res = rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nX-Session-Id: %s\r\nContent-Length: %d", contract.PathRoute, session, len(body)), []byte(body))
	b := readAll(res)
	if res.StatusCode != contract.StatusHeaderTooLarge || res.Header.Get(contract.HdrReason) != contract.ReasonHeaderTooLarge {
		t.Fatalf("20 KiB header over a 16 KiB limit: %d %q %s", res.StatusCode, res.Header.Get(contract.HdrReason), b)
	}
	if strings.Contains(b, "fasthttp") || !strings.Contains(b, `"code":"header_too_large"`) {
		t.Errorf("431 body %s: want turnout's JSON, not fasthttp's text", b)
	}
}

// After a spike (a peak over a quarter of the budget), the last body done
// hands memory back to the OS, at most once per 5 s.
func TestBudgetReturnsMemoryAfterSpike(t *testing.T) {
	var b bodyBudget
	const limit = 1 << 20
	if !b.take(limit/8, limit) {
		t.Fatal("take")
	}
	b.give(limit/8, limit)
	if b.freedAt.Load() != 0 {
		t.Fatal("returned memory after a small peak")
	}
	if !b.take(limit/2, limit) || b.take(limit, limit) {
		t.Fatal("budget accounting")
	}
	b.give(limit/2, limit)
	if b.freedAt.Load() == 0 || b.used.Load() != 0 {
		t.Fatalf("spike over: freedAt %d used %d", b.freedAt.Load(), b.used.Load())
	}
}

// Issue 16 finding 8 (turnout's side): a 404 echoing a huge model name
// stays far under contract.MaxAnswerBody, which sizes nginx's subrequest buffer.
func TestAnswerBounded(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(limitsConfig, 64<<20))
	ctx := do(s, `{"model":"`+strings.Repeat("m", 20000)+`"}`)
	if ctx.Response.StatusCode() != 404 || len(ctx.Response.Body()) > contract.MaxAnswerBody {
		t.Fatalf("%d, %d bytes: want 404 under %d bytes", ctx.Response.StatusCode(), len(ctx.Response.Body()), contract.MaxAnswerBody)
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct{ yaml, field string }{
		{"limits: {max_conns: -1}", "limits.max_conns"},
		{"limits: {max_header_bytes: 4096}", "limits.max_header_bytes"},
		{"limits: {max_buffered_bytes: 1024}", "limits.max_buffered_bytes"},
		{"limits: {read_timeout: 10ms}", "limits.read_timeout"},
		{"limits: {body_idle_timeout: 1h}", "limits.body_idle_timeout"},
	} {
		_, err := config.ParseConfig([]byte(c.yaml + "\ndeployments: [{name: d, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]}]\n"))
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want an error naming %s", c.yaml, err, c.field)
		}
	}
	c := routetest.MustConfig(t, "deployments: [{name: d, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]}]\n")
	if l := c.Limits; l.MaxConns != 4096 || l.MaxBufferedBytes != 64<<20 || l.MaxHeaderBytes != 32<<10 || l.ReadTimeout.D() != 10*time.Second || l.BodyIdleTimeout.D() != 2*time.Second {
		t.Errorf("defaults: %+v", l)
	}
}

// limits.max_conns: the connection over the cap gets a 503 with the
// overloaded reason (the glue fails open without blaming turnout); a slot
// freed is usable again.
func TestMaxConns(t *testing.T) {
	s := mustServer(t, strings.Replace(fmt.Sprintf(limitsConfig, 64<<20), "max_header_bytes: 16384", "max_header_bytes: 16384, max_conns: 2", 1))
	addr := serveHTTP(t, s)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	time.Sleep(50 * time.Millisecond)
	body := `{"model":"llama"}`
	res := rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d", contract.PathRoute, len(body)), []byte(body))
	if res.StatusCode != 503 || res.Header.Get(contract.HdrReason) != contract.ReasonOverloaded {
		t.Fatalf("third connection: %d %q", res.StatusCode, res.Header.Get(contract.HdrReason))
	}
	if e := routetest.ErrBody(t, []byte(readAll(res))); e.Code != contract.ReasonOverloaded || e.Type != "service_unavailable" {
		t.Fatalf("third connection's body: %+v", e)
	}
	held[0].Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		res = rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d", contract.PathRoute, len(body)), []byte(body))
		if res.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a connection closed: %d", res.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	held[1].Close()
}

// Issue 28 item 3: a burst of bodies that each held little of the budget
// at once but left pooled buffers behind (new buffers worth an eighth of
// the limit) still returns memory once the last body is done; a quiet
// server does not.
func TestBudgetReturnsPooledBuffers(t *testing.T) {
	const limit = 64 << 20
	var b bodyBudget
	for range 40 { // 40 requests of 256 KiB, one at a time: peak 256 KiB
		if !b.take(256<<10, limit) {
			t.Fatal("budget refused")
		}
		b.grow(256 << 10)
		b.give(256<<10, limit)
	}
	if b.freedAt.Load() == 0 {
		t.Fatal("memory not returned after 10 MiB of new body buffers")
	}
	var quiet bodyBudget
	for range 40 {
		quiet.take(4<<10, limit)
		quiet.give(4<<10, limit)
	}
	if quiet.freedAt.Load() != 0 {
		t.Fatal("memory returned without a spike")
	}
}
