package spoe

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestVarint(t *testing.T) {
	for _, tc := range []struct {
		v    uint64
		want []byte
	}{
		{0, []byte{0}},
		{239, []byte{239}},
		{240, []byte{240, 0}},
		{2287, []byte{255, 127}},
		{2288, []byte{240, 128, 0}},
	} {
		if got := AppendVarint(nil, tc.v); !bytes.Equal(got, tc.want) {
			t.Errorf("AppendVarint(%d) = % x, want % x", tc.v, got, tc.want)
		}
	}
	for _, v := range []uint64{0, 1, 239, 240, 241, 2287, 2288, 264431, 264432, 33818863, 33818864, 1 << 32, 1<<63 + 5} {
		b := AppendVarint(nil, v)
		got, n, err := readVarint(b)
		if err != nil || got != v || n != len(b) || n != varintLen(v) {
			t.Errorf("varint %d: got %d n=%d len=%d err=%v", v, got, n, varintLen(v), err)
		}
		if _, _, err := readVarint(b[:len(b)-1]); len(b) > 1 && err == nil {
			t.Errorf("varint %d cut short decoded", v)
		}
	}
}

// agentConn starts an agent on loopback and returns a client connection
// that has done the HELLO handshake with maxFrame.
func agentConn(t *testing.T, a *Agent, maxFrame uint32) (net.Conn, *bufio.Reader, map[string]string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(haproxyHello(maxFrame, false)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	h, p := readFrame(t, br)
	if h.Type != frameAgentHello {
		t.Fatalf("got frame type %d, want AGENT-HELLO", h.Type)
	}
	return c, br, kvs(t, p)
}

func readFrame(t *testing.T, br *bufio.Reader) (header, []byte) {
	t.Helper()
	var lb [4]byte
	if _, err := io.ReadFull(br, lb[:]); err != nil {
		t.Fatalf("read frame length: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(lb[:]))
	if _, err := io.ReadFull(br, b); err != nil {
		t.Fatalf("read frame: %v", err)
	}
	h, p, err := readHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	return h, p
}

func kvs(t *testing.T, p []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	it := kvIter{b: p}
	for it.next() {
		switch it.Value.Type {
		case typeString, typeBinary:
			out[string(it.Name)] = string(it.Value.Bytes)
		default:
			out[string(it.Name)] = fmt.Sprint(it.Value.Uint + uint64(it.Value.Int))
		}
	}
	if it.err != nil {
		t.Fatal(it.err)
	}
	return out
}

func TestHello(t *testing.T) {
	a := mustAgent(t, oneDeployment)
	_, _, kv := agentConn(t, a, 16380)
	if kv["version"] != "2.0" || kv["max-frame-size"] != "16380" || !strings.Contains(kv["capabilities"], "pipelining") {
		t.Fatalf("AGENT-HELLO %v", kv)
	}

	// A health check gets AGENT-HELLO, then the agent closes.
	c2, err := net.Dial("tcp", connAddr(t, a))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c2.Write(haproxyHello(1<<20, true))
	br := bufio.NewReader(c2)
	if h, _ := readFrame(t, br); h.Type != frameAgentHello {
		t.Fatalf("health check answer type %d", h.Type)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("connection still open after health check: %v", err)
	}
}

// connAddr starts another agent listener for a.
func connAddr(t *testing.T, a *Agent) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

func TestPipelinedNotifies(t *testing.T) {
	a := mustAgent(t, twoDeployments)
	c, br, _ := agentConn(t, a, 16380)
	const n = 50
	var burst []byte
	for i := range n {
		p := messagesPayload(MessageRoute, routeArgs("POST", "/v1/chat/completions", chatBody("qwen", "hi"), "x-request-id", fmt.Sprint(i)))
		burst = append(burst, rawFrame(frameNotify, flagFin, uint64(100+i), uint64(i%3), p)...)
	}
	if _, err := c.Write(burst); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for range n {
		h, p := readFrame(t, br)
		if h.Type != frameAck || h.FrameID != (h.StreamID-100)%3 {
			t.Fatalf("ACK %+v", h)
		}
		seen[h.StreamID] = true
		if v := vars(t, p); v[VarPool] != "qwen_mixed" {
			t.Fatalf("stream %d vars %v", h.StreamID, v)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct ACKs, want %d", len(seen), n)
	}
	// A message the agent does not know gets an empty ACK.
	_, _ = c.Write(rawFrame(frameNotify, flagFin, 9, 9, messagesPayload("other", []targ{strArg("x", "y")})))
	if h, p := readFrame(t, br); h.StreamID != 9 || len(p) != 0 {
		t.Fatalf("ACK %+v with %d bytes of actions", h, len(p))
	}
}

func TestFragmentedAndLargeNotify(t *testing.T) {
	a := mustAgent(t, twoDeployments)
	c, br, _ := agentConn(t, a, 1<<20)
	// 200 KiB of prompt after the model: only a complete reassembly routes on it.
	body := `{"model":"qwen","prompt":"` + strings.Repeat("x", 200<<10) + `"}`
	p := messagesPayload(MessageRoute, routeArgs("POST", "/v1/completions", body))

	// One large frame (bigger than the read buffer).
	_, _ = c.Write(rawFrame(frameNotify, flagFin, 1, 1, p))
	if h, ap := readFrame(t, br); h.StreamID != 1 || vars(t, ap)[VarPool] != "qwen_mixed" {
		t.Fatalf("large frame: %+v %v", h, vars(t, ap))
	}

	// An aborted fragmented frame gets no ACK...
	_, _ = c.Write(rawFrame(frameNotify, 0, 2, 1, p[:1000]))
	_, _ = c.Write(rawFrame(frameUnset, flagFin|flagAbort, 2, 1, nil))
	// ...and a complete one in three pieces is reassembled.
	_, _ = c.Write(rawFrame(frameNotify, 0, 3, 1, p[:1000]))
	_, _ = c.Write(rawFrame(frameUnset, 0, 3, 1, p[1000:100000]))
	_, _ = c.Write(rawFrame(frameUnset, flagFin, 3, 1, p[100000:]))
	h, ap := readFrame(t, br)
	if h.StreamID != 3 || vars(t, ap)[VarPool] != "qwen_mixed" {
		t.Fatalf("fragmented frame: %+v %v", h, vars(t, ap))
	}
	if s := a.Stats(); s.Fragmented != 1 || s.Notifies != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestProtocolErrorsDisconnect(t *testing.T) {
	a := mustAgent(t, oneDeployment)
	for _, tc := range []struct {
		name   string
		frame  []byte
		status string
	}{
		{"garbage message list", rawFrame(frameNotify, flagFin, 1, 1, []byte{200, 1, 2}), "4"},
		{"frame over max-frame-size", rawFrame(frameNotify, flagFin, 1, 1, make([]byte, 20000)), "3"},
		{"orphan fragment", rawFrame(frameUnset, flagFin, 1, 1, nil), "10"},
		{"haproxy disconnect", rawFrame(frameHAProxyDisconnect, flagFin, 0, 0,
			appendStringValue(appendString(appendUint32Value(appendString(nil, "status-code"), 0), "message"), []byte("stop"))), "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br, _ := agentConn(t, a, 16380)
			_, _ = c.Write(tc.frame)
			h, p := readFrame(t, br)
			if h.Type != frameAgentDisconnect || kvs(t, p)["status-code"] != tc.status {
				t.Fatalf("got type %d %v, want AGENT-DISCONNECT status %s", h.Type, kvs(t, p), tc.status)
			}
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				t.Fatalf("connection open after disconnect: %v", err)
			}
		})
	}
}

// slowPDAgent is an agent over twoDeployments plus a prefill/decode
// deployment "pd" whose prefill takes 400 ms.
func slowPDAgent(t *testing.T) *Agent {
	t.Helper()
	return mustAgent(t, twoDeployments+fmt.Sprintf(`
  - name: pd
    models: [pd]
    policy: {name: round-robin}
    pd: {prefill_timeout: 5s}
    pools:
      - role: prefill
        endpoints: [{name: p0, address: %s}]
      - role: decode
        endpoints: [{name: d0, address: 127.0.0.1:9101}]
`, startSlowPrefill(t, 400*time.Millisecond)))
}

// With a prefill/decode deployment, decisions run on workers: a slow
// prefill must not hold up a fast decision multiplexed behind it.
func TestBlockingDecisionsDoNotHoldTheConnection(t *testing.T) {
	a := slowPDAgent(t)
	c, br, _ := agentConn(t, a, 16380)
	start := time.Now()
	_, _ = c.Write(rawFrame(frameNotify, flagFin, 1, 1, messagesPayload(MessageRoutePD, routeArgs("POST", "/v1/chat/completions", chatBody("pd", "hi")))))
	_, _ = c.Write(rawFrame(frameNotify, flagFin, 2, 1, messagesPayload(MessageRoute, routeArgs("POST", "/v1/chat/completions", chatBody("qwen", "hi")))))
	h, _ := readFrame(t, br)
	if h.StreamID != 2 || time.Since(start) > 200*time.Millisecond {
		t.Fatalf("first ACK is stream %d after %v, want the fast decision (2) first", h.StreamID, time.Since(start))
	}
	h, p := readFrame(t, br)
	if v := vars(t, p); h.StreamID != 1 || v[VarPrefill] != "p0" {
		t.Fatalf("second ACK stream %d vars %v", h.StreamID, v)
	}
}

// The first call (MessageRoute, bounded by route_timeout in HAProxy) never
// waits on a prefill: a prefill/decode request is only marked (VarPD) and
// decided on the second call (MessageRoutePD); other requests are decided
// on the first.
func TestFirstCallMarksPrefillDecode(t *testing.T) {
	a := slowPDAgent(t)
	c, br, _ := agentConn(t, a, 16380)
	for i, tc := range []struct {
		model, want string
	}{{"pd", "pd"}, {"qwen", "server"}, {"nope", "status"}} {
		start := time.Now()
		_, _ = c.Write(rawFrame(frameNotify, flagFin, uint64(i+1), 1, messagesPayload(MessageRoute, deferPD(routeArgs("POST", "/v1/chat/completions", chatBody(tc.model, "hi"))))))
		h, p := readFrame(t, br)
		v := vars(t, p)
		if took := time.Since(start); h.StreamID != uint64(i+1) || took > 200*time.Millisecond {
			t.Fatalf("%s: ACK for stream %d after %v", tc.model, h.StreamID, took)
		}
		if _, ok := v[tc.want]; !ok {
			t.Errorf("%s: vars %v, want %s set", tc.model, v, tc.want)
		}
		if _, ok := v[VarPD]; ok != (tc.model == "pd") {
			t.Errorf("%s: vars %v: pd mark %v", tc.model, v, ok)
		}
		if v[VarPrefill] != "" {
			t.Errorf("%s: the first call ran a prefill: %v", tc.model, v)
		}
	}
}

func startSlowPrefill(t *testing.T, d time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		time.Sleep(d)
		ctx.SetBodyString(`{"kv_transfer_params":{"remote_engine_id":"e"}}`)
	}}
	go s.Serve(ln) //nolint:errcheck // ends when the listener closes
	t.Cleanup(func() { _ = s.Shutdown() })
	return ln.Addr().String()
}

func TestServeStopsWithContext(t *testing.T) {
	a := mustAgent(t, oneDeployment)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(haproxyHello(16380, false))
	br := bufio.NewReader(c)
	readFrame(t, br)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if h, p := readFrame(t, br); h.Type != frameAgentDisconnect || kvs(t, p)["status-code"] != "0" {
		t.Fatalf("got frame type %d %v, want AGENT-DISCONNECT 0", h.Type, kvs(t, p))
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("connection still open after shutdown")
	}
}

// Zero allocations per decision, from NOTIFY bytes to ACK bytes, through
// the connection's inline path.
func TestNotifyAllocs(t *testing.T) {
	for _, tc := range []struct{ name, cfg, model string }{
		{"session-hash", twoDeployments, "llama"},
		{"least-request", oneDeployment, "solo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := mustAgent(t, tc.cfg)
			body := chatBody(tc.model, strings.Repeat("Tell me more about routing. ", 36)) // ~1 KiB
			frame := rawFrame(frameNotify, flagFin, 77, 3, messagesPayload(MessageRoute,
				routeArgs("POST", "/v1/chat/completions", body, "host", "x", "content-type", "application/json",
					"x-session-id", "user-1", "authorization", "Bearer k", "content-length", fmt.Sprint(len(body)))))
			src := &loopReader{frame: frame}
			c := &conn{a: a, br: bufio.NewReaderSize(src, readBufSize), bw: bufio.NewWriterSize(io.Discard, 16<<10), maxFrame: 16380}
			c.d = newDecider(a.srv, a.names)
			run := func() {
				fr, err := c.readFrame()
				if err != nil {
					t.Fatal(err)
				}
				h, p, _ := readHeader(fr)
				if err := c.notify(h, p); err != nil {
					t.Fatal(err)
				}
				complete(a, c.out)
			}
			for range 100 {
				run()
			}
			if n := testing.AllocsPerRun(500, run); n != 0 {
				t.Fatalf("%v allocations per NOTIFY", n)
			}
		})
	}
}

// complete closes the decision in an ACK, as the feedback log line would;
// false if the ACK has none.
func complete(a *Agent, ackFrame []byte) bool {
	_, p, _ := readHeader(ackFrame[4:])
	for len(p) > 3 {
		name, n, _ := readBytes(p[3:])
		v, k, err := readValue(p[3+n:])
		if err != nil {
			return false
		}
		if string(name) == VarDecision {
			var id uint64
			for _, c := range v.Bytes {
				id = id<<4 | uint64(hexVal(c))
			}
			a.srv.Ledger().Complete(id)
			return true
		}
		p = p[3+n+k:]
	}
	return false
}

func hexVal(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

// loopReader serves the same frame forever.
type loopReader struct {
	frame []byte
	off   int
}

func (r *loopReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k := copy(p[n:], r.frame[r.off:])
		n += k
		r.off = (r.off + k) % len(r.frame)
	}
	return n, nil
}

func BenchmarkNotify(b *testing.B) {
	a := mustAgent(b, twoDeployments)
	body := chatBody("llama", strings.Repeat("Tell me more about routing. ", 36))
	frame := rawFrame(frameNotify, flagFin, 77, 3, messagesPayload(MessageRoute,
		routeArgs("POST", "/v1/chat/completions", body, "content-type", "application/json", "x-session-id", "user-1")))
	c := &conn{a: a, br: bufio.NewReaderSize(&loopReader{frame: frame}, readBufSize), bw: bufio.NewWriterSize(io.Discard, 16<<10), maxFrame: 16380}
	c.d = newDecider(a.srv, a.names)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		fr, _ := c.readFrame()
		h, p, _ := readHeader(fr)
		if err := c.notify(h, p); err != nil {
			b.Fatal(err)
		}
		complete(a, c.out)
	}
}

func FuzzNotify(f *testing.F) {
	a := mustAgent(f, twoDeployments)
	f.Add(messagesPayload(MessageRoute, routeArgs("POST", "/v1/x", chatBody("llama", "hi"), "x-session-id", "a")))
	f.Add(messagesPayload(MessageRoute, routeArgs("POST", "/v1/x", `{"model":"nope"}`)))
	f.Add([]byte{13, 't', 'u', 'r', 'n', 'o', 'u', 't', '-', 'r', 'o', 'u', 't', 'e', 1, 4, 'h', 'd', 'r', 's', 9, 250})
	d := newDecider(a.srv, a.names)
	f.Fuzz(func(t *testing.T, payload []byte) {
		out, err := ack(d, header{StreamID: 1, FrameID: 1}, payload, nil, 16380)
		if err != nil {
			return
		}
		if len(out)-4 > 16380 {
			t.Fatalf("ACK of %d bytes", len(out)-4)
		}
		_, p, err := readHeader(out[4:])
		if err != nil {
			t.Fatal(err)
		}
		for len(p) > 0 { // every action must decode
			_, n, err := readBytes(p[3:])
			if err != nil {
				t.Fatal(err)
			}
			_, k, err := readValue(p[3+n:])
			if err != nil {
				t.Fatal(err)
			}
			p = p[3+n+k:]
		}
	})
}

// Zero allocations per NOTIFY in the whole process over a real connection:
// the reader's socket reads, the decision, the batched ACK write and the
// scheduler's hand-offs, as HAProxy drives them (pipelined bursts).
func TestServeAllocs(t *testing.T) {
	a := mustAgent(t, twoDeployments)
	c, br, _ := agentConn(t, a, 16380)
	_ = c.SetDeadline(time.Time{})
	const burst = 4
	var frames []byte
	for i := range burst {
		body := chatBody("llama", fmt.Sprintf("conversation %d: ", i)+strings.Repeat("Tell me more about routing. ", 36))
		frames = append(frames, rawFrame(frameNotify, flagFin, uint64(10+i), 1, messagesPayload(MessageRoute,
			routeArgs("POST", "/v1/chat/completions", body, "host", "127.0.0.1", "content-type", "application/json",
				"content-length", fmt.Sprint(len(body)), "x-request-id", fmt.Sprintf("req-%d", i), "x-session-id", fmt.Sprint("user-", i))))...)
	}
	ackBuf := make([]byte, 16<<10)
	run := func() {
		if _, err := c.Write(frames); err != nil {
			t.Fatal(err)
		}
		for range burst {
			if _, err := io.ReadFull(br, ackBuf[:4]); err != nil {
				t.Fatal(err)
			}
			n := int(binary.BigEndian.Uint32(ackBuf[:4]))
			if _, err := io.ReadFull(br, ackBuf[4:4+n]); err != nil {
				t.Fatal(err)
			}
			if !complete(a, ackBuf[:4+n]) {
				t.Fatal("ACK without a decision")
			}
		}
	}
	for range 200 {
		run()
	}
	if n := testing.AllocsPerRun(500, run); n != 0 {
		t.Fatalf("%v allocations per burst of %d NOTIFYs", n, burst)
	}
}
