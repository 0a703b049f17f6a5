package epp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Interop of the inline server with grpc-go's client (and a raw HTTP/2
// client where the frames themselves are the point).

// inlineHarness is a harness on the inline server; skipped when the
// tests run against grpc-go (TURNOUT_EPP_SERVER=grpc).
func inlineHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, fleetYAML)
	if h.s.grpc {
		t.Skip("the inline server's interop")
	}
	return h
}

// A client cancel mid-body on an inline stream gives its held bytes back.
func TestEPP_InlineCancelMidBody(t *testing.T) {
	h := inlineHarness(t)
	g := h.open(t)
	g.send(chatHeaders(false))
	g.send(reqBody(chat("llama", strings.Repeat("x", 1000)), false))
	eventually(t, 10*time.Second, func() error {
		if h.s.budget.used.Load() == 0 {
			return fmt.Errorf("the mid-body bytes are not held yet")
		}
		return nil
	})
	g.cancel()
	eventually(t, 10*time.Second, func() error {
		if n := h.s.budget.used.Load(); n != 0 {
			return fmt.Errorf("%d bytes still held after the cancel", n)
		}
		return nil
	})
	// The connection goes on serving.
	g2 := h.open(t)
	g2.send(chatHeaders(false))
	g2.sendBody(chat("llama", "after"), 64<<10)
	routed(t, g2.recv())
}

// A body passed back that is larger than the client's windows waits for
// them, without holding up the other streams of the connection.
func TestEPP_BodyLargerThanPeerWindow(t *testing.T) {
	h := inlineHarness(t)
	// Static 64 KiB windows: grpc-go's client opens them as it reads.
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return h.ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func() extprocv3.ExternalProcessor_ProcessClient {
		c, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	big := chat("llama", strings.Repeat("y", 300<<10))
	a := open()
	for _, m := range []*extprocv3.ProcessingRequest{chatHeaders(false), reqBody(big, true)} {
		if err := a.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	// a's answers are not read: its window fills. b is answered meanwhile.
	b := open()
	for _, m := range []*extprocv3.ProcessingRequest{chatHeaders(false), reqBody(chat("llama", "small"), true)} {
		if err := b.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	rb, err := b.Recv()
	if err != nil {
		t.Fatalf("b while a waits on its window: %v", err)
	}
	routed(t, rb)

	ra, err := a.Recv()
	if err != nil {
		t.Fatal(err)
	}
	routed(t, ra)
	ra, err = a.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got, eos := streamedChunk(t, ra)
	if !bytes.Equal(got, big) || !eos {
		t.Fatalf("passed back %d bytes (eos %v), sent %d", len(got), eos, len(big))
	}
}

// Many streams at once on one connection are each decided and ended.
func TestEPP_ManyStreamsOneConnection(t *testing.T) {
	h := inlineHarness(t)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := extprocv3.NewExternalProcessorClient(h.conn).Process(ctx)
			if err != nil {
				errs <- err
				return
			}
			body := chat("qwen", fmt.Sprint("stream ", i))
			for _, m := range []*extprocv3.ProcessingRequest{chatHeaders(false), reqBody(body, true)} {
				if err := c.Send(m); err != nil {
					errs <- err
					return
				}
			}
			r, err := c.Recv()
			if err != nil {
				errs <- err
				return
			}
			if r.GetRequestHeaders() == nil {
				errs <- fmt.Errorf("stream %d: %T first", i, r.Response)
				return
			}
			r, err = c.Recv()
			if err != nil {
				errs <- err
				return
			}
			if got := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); !bytes.Equal(got, body) {
				errs <- fmt.Errorf("stream %d: body %q", i, got)
				return
			}
			if err := c.CloseSend(); err != nil {
				errs <- err
				return
			}
			if _, err := c.Recv(); err != io.EOF {
				errs <- fmt.Errorf("stream %d end: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Methods other than Process and health Check are UNIMPLEMENTED, as are
// compressed messages (with a clear message).
func TestEPP_UnimplementedAnswers(t *testing.T) {
	h := inlineHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := h.conn.Invoke(ctx, "/some.Service/Method", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: %v, want Unimplemented", err)
	}
	w, err := healthpb.NewHealthClient(h.conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthLiveness})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("health Watch: %v, want Unimplemented", err)
	}
	c, err := extprocv3.NewExternalProcessorClient(h.conn).Process(ctx, grpc.UseCompressor(gzip.Name))
	if err == nil {
		_ = c.Send(chatHeaders(true)) // io.EOF when the stream already ended: Recv says why
		_, err = c.Recv()
	}
	if status.Code(err) != codes.Unimplemented || !strings.Contains(status.Convert(err).Message(), "compressed") {
		t.Errorf("compressed stream: %v, want Unimplemented naming compression", err)
	}
	// The connection still serves.
	if _, err := healthpb.NewHealthClient(h.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: HealthLiveness}); err != nil {
		t.Errorf("health Check after: %v", err)
	}
}

// rawClient is an HTTP/2 client frame by frame.
type rawClient struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

func dialRaw(t *testing.T, h *harness) *rawClient {
	t.Helper()
	nc, err := h.ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	c := &rawClient{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *rawClient) open(id uint32, path string) {
	c.t.Helper()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "epp"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawClient) send(id uint32, m proto.Message, end bool) {
	c.t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.fr.WriteData(id, end, append(grpcFrameHeader(nil, len(b)), b...)); err != nil {
		c.t.Fatal(err)
	}
}

// until reads frames, answering SETTINGS and PING, until f says done.
func (c *rawClient) until(what string, f func(http2.Frame) bool) {
	c.t.Helper()
	for {
		fr, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("waiting for %s: %v", what, err)
		}
		if s, ok := fr.(*http2.SettingsFrame); ok && !s.IsAck() {
			_ = c.fr.WriteSettingsAck()
		}
		if f(fr) {
			return
		}
	}
}

// Shutdown sends GOAWAY naming the last stream, lets that stream end,
// refuses new ones, and closes the connection once it is idle.
func TestEPP_GoAwayAtShutdown(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	c.open(1, pathProcess)
	c.send(1, chatHeaders(false), false)
	// Frames are taken in order: the PING's ACK says stream 1 is open.
	if err := c.fr.WritePing(false, [8]byte{7}); err != nil {
		t.Fatal(err)
	}
	c.until("the PING's ACK", func(f http2.Frame) bool {
		p, ok := f.(*http2.PingFrame)
		return ok && p.IsAck() && p.Data == [8]byte{7}
	})

	done := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		h.l.Shutdown(ctx)
		close(done)
	}()
	c.until("GOAWAY", func(f http2.Frame) bool {
		g, ok := f.(*http2.GoAwayFrame)
		if ok && (g.LastStreamID != 1 || g.ErrCode != http2.ErrCodeNo) {
			t.Fatalf("GOAWAY last stream %d code %v, want 1 NO_ERROR", g.LastStreamID, g.ErrCode)
		}
		return ok
	})
	select {
	case <-done:
		t.Fatal("Shutdown returned with a stream open")
	default:
	}
	c.open(3, pathProcess)
	c.send(1, reqBody(chat("llama", "during shutdown"), true), true)
	refused, answered := false, false
	c.until("stream 1's trailers", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			if f.StreamID == 3 && f.ErrCode == http2.ErrCodeRefusedStream {
				refused = true
			}
		case *http2.DataFrame:
			answered = answered || f.StreamID == 1
		case *http2.MetaHeadersFrame:
			if f.StreamID == 3 {
				t.Fatal("a stream opened after GOAWAY was served")
			}
			if f.StreamID == 1 && f.StreamEnded() {
				if s := f.PseudoValue("status"); s == "" && !answered {
					t.Fatal("stream 1 ended without its answers")
				}
				for _, hf := range f.RegularFields() {
					if hf.Name == "grpc-status" && hf.Value != "0" {
						t.Fatalf("stream 1 ended with grpc-status %s", hf.Value)
					}
				}
				return true
			}
		}
		return false
	})
	if !answered || !refused {
		t.Fatalf("stream 1 answered %v, stream 3 refused %v", answered, refused)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown did not return once the last stream ended")
	}
	for {
		if _, err := c.fr.ReadFrame(); err != nil {
			break // the connection closed
		}
	}
}

// grpcFrameHeader is a gRPC message's prefix: uncompressed, its length.
func grpcFrameHeader(b []byte, n int) []byte {
	return binary.BigEndian.AppendUint32(append(b, 0), uint32(n))
}

// The header blocks encoded once decode to the fields every answered
// stream sends, and leave the decoder's dynamic table empty (so they mix
// with the encoder's blocks on one connection).
func TestEPP_PreEncodedHeaderBlocks(t *testing.T) {
	for _, tc := range []struct {
		block string
		want  []hpack.HeaderField
	}{
		{hpackHeaders, []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}}},
		{hpackTrailersOK, []hpack.HeaderField{{Name: "grpc-status", Value: "0"}, {Name: "grpc-message", Value: ""}}},
	} {
		var got []hpack.HeaderField
		d := hpack.NewDecoder(4096, func(f hpack.HeaderField) { got = append(got, f) })
		if _, err := d.Write([]byte(tc.block)); err != nil {
			t.Fatalf("%q: %v", tc.block, err)
		}
		if err := d.Close(); err != nil {
			t.Fatalf("%q: %v", tc.block, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%q decodes to %v, want %v", tc.block, got, tc.want)
		}
		// Index 62 is the dynamic table's first entry: there is none.
		if _, err := d.Write([]byte{0x80 | 62}); err == nil {
			t.Errorf("%q added an entry to the dynamic table", tc.block)
		}
	}
}

// Over TLS, input crypto/tls has already read counts as buffered (the
// burst's answers wait for it), and the check neither loses nor blocks
// on input.
func TestEPP_TLSBufferedInput(t *testing.T) {
	cert, err := selfSigned(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sent := make(chan error, 1)
	go func() {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			sent <- err
			return
		}
		cc := tls.Client(nc, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test's own certificate
		defer cc.Close()
		// Two writes: two records.
		if _, err := cc.Write([]byte("a")); err != nil {
			sent <- err
			return
		}
		_, err = cc.Write([]byte("b"))
		sent <- err
		_, _ = io.Copy(io.Discard, cc) // until the server closes
	}()
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Server(nc, &tls.Config{Certificates: []tls.Certificate{cert}})
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	_ = tc.SetDeadline(time.Time{})
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	c := &h2Conn{nc: tc, br: bufio.NewReaderSize(tc, connBuf)}
	if b, err := c.br.ReadByte(); err != nil || b != 'a' {
		t.Fatalf("first byte %q, %v", b, err)
	}
	if !c.tlsBuffered() {
		t.Fatal("the second record, read from the socket with the first, is not seen as buffered")
	}
	if b, err := c.br.ReadByte(); err != nil || b != 'b' {
		t.Fatalf("second byte %q, %v: the check lost input", b, err)
	}
	if c.tlsBuffered() {
		t.Fatal("nothing more was sent, yet input is seen as buffered")
	}
	// The connection still reads (the check left no error behind).
	_ = tc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after the checks: %v, want a plain timeout", err)
	}
}
