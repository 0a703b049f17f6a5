package epp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// Conformance of the inline server with what an HTTP/2 client such as
// Envoy's codec may send: header blocks in CONTINUATION frames, padding,
// PRIORITY, tiny and large windows, SETTINGS mid-connection (HPACK table
// size 0 included), PING, RST_STREAM and GOAWAY from the client, a body in
// many DATA frames ended by an empty one. Each case drives a raw framer
// and checks the answers as a gateway reads them.

// headerOpts shape a request's header block.
type headerOpts struct {
	split    int   // > 0: the block in HEADERS + CONTINUATION frames of split bytes
	pad      uint8 // HEADERS padding
	priority bool  // a priority section in HEADERS
	prelude  []byte
}

// openWith opens stream id as a gRPC Process call, its header block shaped
// by o.
func (c *rawClient) openWith(id uint32, o headerOpts) {
	c.t.Helper()
	c.hbuf.Reset()
	c.hbuf.Write(o.prelude)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", pathProcess}, {":authority", "epp"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"x-envoy-internal", strings.Repeat("x", 40)}} {
		_ = c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := c.hbuf.Bytes()
	first := block
	if o.split > 0 && o.split < len(block) {
		first = block[:o.split]
	}
	p := http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(first) == len(block), PadLength: o.pad}
	if o.priority {
		p.Priority = http2.PriorityParam{StreamDep: 0, Weight: 200, Exclusive: true}
	}
	if err := c.fr.WriteHeaders(p); err != nil {
		c.t.Fatal(err)
	}
	for rest := block[len(first):]; len(rest) > 0; {
		n := min(o.split, len(rest))
		if err := c.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			c.t.Fatal(err)
		}
		rest = rest[n:]
	}
}

// sendSplit sends m on id in DATA frames of at most size bytes (padded by
// pad), then, with endEmpty, an empty DATA frame ending the stream.
func (c *rawClient) sendSplit(id uint32, m proto.Message, size int, pad uint8, endEmpty bool) {
	c.t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		c.t.Fatal(err)
	}
	b = append(grpcFrameHeader(nil, len(b)), b...)
	for len(b) > 0 {
		n := min(size, len(b))
		if err := c.fr.WriteDataPadded(id, false, b[:n], make([]byte, pad)); err != nil {
			c.t.Fatal(err)
		}
		b = b[n:]
	}
	if endEmpty {
		if err := c.fr.WriteData(id, true, nil); err != nil {
			c.t.Fatal(err)
		}
	}
}

// exchange is what came back on a stream.
type exchange struct {
	msgs     []*extprocv3.ProcessingResponse
	status   string // grpc-status of the trailers
	reset    bool
	maxFrame int // the largest DATA frame
}

// collect reads until id's trailers (or a reset), answering SETTINGS and
// PING; with grant it gives each DATA frame's bytes back to the stream's
// and the connection's windows as they come.
func (c *rawClient) collect(id uint32, grant bool) exchange {
	c.t.Helper()
	var x exchange
	var buf []byte
	c.until(fmt.Sprintf("stream %d's end", id), func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.DataFrame:
			if f.StreamID != id {
				return false
			}
			buf = append(buf, f.Data()...)
			x.maxFrame = max(x.maxFrame, len(f.Data()))
			if grant && len(f.Data()) > 0 {
				_ = c.fr.WriteWindowUpdate(id, uint32(len(f.Data())))
				_ = c.fr.WriteWindowUpdate(0, uint32(len(f.Data())))
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == id && f.StreamEnded() {
				for _, hf := range f.Fields {
					if hf.Name == "grpc-status" {
						x.status = hf.Value
					}
				}
				return true
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				x.reset = true
				return true
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = c.fr.WritePing(true, f.Data)
			}
		}
		return false
	})
	for len(buf) >= 5 {
		n := int(binary.BigEndian.Uint32(buf[1:5]))
		if len(buf) < 5+n {
			c.t.Fatalf("stream %d: a message cut short (%d of %d bytes)", id, len(buf)-5, n)
		}
		m := &extprocv3.ProcessingResponse{}
		if err := proto.Unmarshal(buf[5:5+n], m); err != nil {
			c.t.Fatalf("stream %d: not a ProcessingResponse: %v", id, err)
		}
		x.msgs = append(x.msgs, m)
		buf = buf[5+n:]
	}
	if len(buf) > 0 {
		c.t.Fatalf("stream %d: %d bytes after the last message", id, len(buf))
	}
	return x
}

// routedWhole checks a FULL_DUPLEX exchange: the pick, then body the whole
// request body passed back, the stream ended OK.
func routedWhole(t *testing.T, x exchange, body []byte) {
	t.Helper()
	if x.reset || x.status != "0" {
		t.Fatalf("stream ended reset %v grpc-status %q", x.reset, x.status)
	}
	if len(x.msgs) < 2 {
		t.Fatalf("%d answers, want the pick and the body", len(x.msgs))
	}
	if p := routed(t, x.msgs[0]); p.header == "" || p.header != p.meta {
		t.Fatalf("pick header %q metadata %q", p.header, p.meta)
	}
	var got []byte
	eos := false
	for _, m := range x.msgs[1:] {
		c, e := streamedChunk(t, m)
		got, eos = append(got, c...), e
	}
	if !bytes.Equal(got, body) || !eos {
		t.Fatalf("body passed back: %d bytes (eos %v), want %d", len(got), eos, len(body))
	}
}

// request sends a FULL_DUPLEX request's two messages on id: its headers
// (shaped by o), its body split in size-byte frames.
func (c *rawClient) request(id uint32, o headerOpts, body []byte, size int, pad uint8) {
	c.openWith(id, o)
	c.sendSplit(id, chatHeaders(false, "content-length", strconv.Itoa(len(body))), size, pad, false)
	c.sendSplit(id, reqBody(body, true), size, pad, true)
}

func TestH2Conform_HeaderBlocksAndPadding(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	body := chat("llama", "continuation frames")
	for i, o := range []headerOpts{
		{split: 1},
		{split: 7, pad: 200, priority: true},
		{pad: 255},
		{priority: true, split: 3},
	} {
		id := uint32(2*i + 1)
		c.request(id, o, body, 1<<14, o.pad)
		routedWhole(t, c.collect(id, false), body)
	}
}

// A PRIORITY frame, on an open stream, on an idle one, and on its own
// stream before it opens, changes nothing.
func TestH2Conform_PriorityFrames(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	body := chat("llama", "priority")
	if err := c.fr.WritePriority(1, http2.PriorityParam{StreamDep: 0, Weight: 15}); err != nil {
		t.Fatal(err)
	}
	c.openWith(1, headerOpts{})
	if err := c.fr.WritePriority(1, http2.PriorityParam{StreamDep: 0, Weight: 255, Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WritePriority(11, http2.PriorityParam{StreamDep: 1, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	c.sendSplit(1, chatHeaders(false), 1<<14, 0, false)
	c.sendSplit(1, reqBody(body, true), 1<<14, 0, true)
	routedWhole(t, c.collect(1, false), body)
}

// A body in many small DATA frames, some padded, the stream ended by an
// empty frame.
func TestH2Conform_BodyInManyDataFrames(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	body := chat("llama", strings.Repeat("many frames ", 400))
	for i, size := range []int{1, 13, 100} {
		id := uint32(2*i + 1)
		c.request(id, headerOpts{}, body, size, uint8(i*3))
		routedWhole(t, c.collect(id, false), body)
	}
}

// Tiny windows: the answers come in frames no larger than the window, as
// the client gives it back; a large window (2^31-1) after is honoured too.
func TestH2Conform_WindowsTinyAndLarge(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 7}); err != nil {
		t.Fatal(err)
	}
	body := chat("llama", strings.Repeat("tiny window ", 50))
	c.request(1, headerOpts{}, body, 1<<14, 0)
	x := c.collect(1, true)
	routedWhole(t, x, body)
	if x.maxFrame > 7 {
		t.Fatalf("a DATA frame of %d bytes through a 7-byte window", x.maxFrame)
	}
	// The stream window at its largest, the connection's raised a lot.
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteWindowUpdate(0, 1<<30); err != nil {
		t.Fatal(err)
	}
	big := chat("llama", strings.Repeat("large window ", 12000))
	c.request(3, headerOpts{}, big, 1<<14, 0)
	x = c.collect(3, false)
	routedWhole(t, x, big)
	if x.maxFrame > 1<<14 {
		t.Fatalf("a DATA frame of %d bytes over the 16 KiB max frame size", x.maxFrame)
	}
	// A window update on an idle and on a closed stream changes nothing.
	_ = c.fr.WriteWindowUpdate(1, 100)
	_ = c.fr.WriteWindowUpdate(99, 100)
	c.request(5, headerOpts{}, body, 1<<14, 0)
	routedWhole(t, c.collect(5, false), body)
}

// SETTINGS mid-connection: the client's HPACK table down to 0 (the
// server's next header blocks must use no dynamic table), its max frame
// size up, and its own encoder's table resized inside a header block.
func TestH2Conform_SettingsMidConnection(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	body := chat("llama", "settings")
	c.request(1, headerOpts{}, body, 1<<14, 0)
	routedWhole(t, c.collect(1, false), body)

	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	acked := false
	c.until("the SETTINGS ACK", func(f http2.Frame) bool {
		s, ok := f.(*http2.SettingsFrame)
		acked = ok && s.IsAck()
		return acked
	})
	// From here the client decodes with no dynamic table: a header block
	// that refers to the old one fails to decode.
	c.fr.ReadMetaHeaders = hpack.NewDecoder(0, nil)
	c.henc.SetMaxDynamicTableSizeLimit(0) // the client's own table, resized in the next block
	c.henc.SetMaxDynamicTableSize(0)
	c.request(3, headerOpts{}, body, 1<<14, 0)
	routedWhole(t, c.collect(3, false), body)
	c.henc.SetMaxDynamicTableSizeLimit(4096)
	c.henc.SetMaxDynamicTableSize(4096)
	c.request(5, headerOpts{}, body, 1<<14, 0)
	routedWhole(t, c.collect(5, false), body)
}

// PING is answered with its data, also in the middle of a stream.
func TestH2Conform_Ping(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	c.openWith(1, headerOpts{})
	c.sendSplit(1, chatHeaders(false), 1<<14, 0, false)
	for i := range 3 {
		data := [8]byte{1, 2, 3, byte(i)}
		if err := c.fr.WritePing(false, data); err != nil {
			t.Fatal(err)
		}
		c.until("the PING's ACK", func(f http2.Frame) bool {
			p, ok := f.(*http2.PingFrame)
			return ok && p.IsAck() && p.Data == data
		})
	}
	body := chat("llama", "ping")
	c.sendSplit(1, reqBody(body, true), 1<<14, 0, true)
	routedWhole(t, c.collect(1, false), body)
}

// RST_STREAM from the client mid-body gives back what the stream held; the
// connection goes on.
func TestH2Conform_ClientResetMidStream(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	c.openWith(1, headerOpts{})
	c.sendSplit(1, chatHeaders(false), 1<<14, 0, false)
	c.sendSplit(1, reqBody(bytes.Repeat([]byte("x"), 5000), false), 1<<14, 0, false)
	c.openWith(3, headerOpts{})
	c.sendSplit(3, chatHeaders(false), 1<<14, 0, false)
	// Half a message on stream 3, then its reset.
	b, _ := proto.Marshal(reqBody([]byte("half"), true))
	if err := c.fr.WriteData(3, false, grpcFrameHeader(nil, len(b))); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		if n := h.s.budget.used.Load(); n != 5000 {
			return fmt.Errorf("%d bytes held, want stream 1's 5000", n)
		}
		return nil
	})
	for _, id := range []uint32{1, 3} {
		if err := c.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, func() error {
		if n := h.s.budget.used.Load(); n != 0 {
			return fmt.Errorf("%d bytes still held after the resets", n)
		}
		return nil
	})
	// Late frames of the reset streams are ignored; a new stream works.
	_ = c.fr.WriteData(1, true, nil)
	body := chat("llama", "after the reset")
	c.request(5, headerOpts{}, body, 1<<14, 0)
	routedWhole(t, c.collect(5, false), body)
}

// GOAWAY from the client: the open stream is served to its end.
func TestH2Conform_ClientGoAway(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	c.openWith(1, headerOpts{})
	c.sendSplit(1, chatHeaders(false), 1<<14, 0, false)
	if err := c.fr.WriteGoAway(0, http2.ErrCodeNo, nil); err != nil {
		t.Fatal(err)
	}
	body := chat("llama", "after GOAWAY")
	c.sendSplit(1, reqBody(body, true), 1<<14, 0, true)
	routedWhole(t, c.collect(1, false), body)
}

// A stream that ends without a response phase: the client half-closes
// after the request's answers; the server ends it OK.
func TestH2Conform_EndWithoutResponsePhase(t *testing.T) {
	h := inlineHarness(t)
	c := dialRaw(t, h)
	body := chat("llama", "no response phase")
	c.openWith(1, headerOpts{})
	c.sendSplit(1, chatHeaders(false), 1<<14, 0, false)
	c.sendSplit(1, reqBody(body, true), 1<<14, 0, false)
	// The answers come before the client half-closes.
	n := 0
	c.until("the pick and the body", func(f http2.Frame) bool {
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 {
			n += len(d.Data())
		}
		return n > len(body)
	})
	if err := c.fr.WriteData(1, true, nil); err != nil {
		t.Fatal(err)
	}
	x := c.collect(1, false)
	if x.reset || x.status != "0" {
		t.Fatalf("stream ended reset %v grpc-status %q", x.reset, x.status)
	}
}

// A SETTINGS value out of the protocol's range ends the connection with
// GOAWAY (a max frame size of 0 would stall every answer).
func TestH2Conform_InvalidSettings(t *testing.T) {
	for _, st := range []http2.Setting{
		{ID: http2.SettingMaxFrameSize, Val: 100},
		{ID: http2.SettingMaxFrameSize, Val: 1 << 24},
		{ID: http2.SettingInitialWindowSize, Val: 1 << 31},
	} {
		h := inlineHarness(t)
		c := dialRaw(t, h)
		if err := c.fr.WriteSettings(st); err != nil {
			t.Fatal(err)
		}
		var code http2.ErrCode
		c.until("GOAWAY", func(f http2.Frame) bool {
			g, ok := f.(*http2.GoAwayFrame)
			if ok {
				code = g.ErrCode
			}
			return ok
		})
		if want := http2.ErrCodeProtocol; st.ID == http2.SettingInitialWindowSize {
			want = http2.ErrCodeFlowControl
			if code != want {
				t.Errorf("%v: GOAWAY %v, want %v", st, code, want)
			}
		} else if code != want {
			t.Errorf("%v: GOAWAY %v, want %v", st, code, want)
		}
	}
}

// DATA where the protocol forbids it ends the connection with GOAWAY
// PROTOCOL_ERROR: on stream 0, and inside a header block (between HEADERS
// and its CONTINUATION).
func TestH2Conform_MisplacedData(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(c *rawClient)
		want http2.ErrCode
	}{
		{"stream 0", func(c *rawClient) {
			c.fr.AllowIllegalWrites = true
			_ = c.fr.WriteData(0, false, []byte("x"))
		}, http2.ErrCodeProtocol},
		{"inside a header block", func(c *rawClient) {
			// The settings exchange first: the DATA is the only frame
			// after the HEADERS.
			c.until("the server's SETTINGS ACK", func(f http2.Frame) bool {
				s, ok := f.(*http2.SettingsFrame)
				return ok && s.IsAck()
			})
			c.hbuf.Reset()
			_ = c.henc.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
			_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hbuf.Bytes()})
			_ = c.fr.WriteData(1, false, []byte("x"))
		}, http2.ErrCodeProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := inlineHarness(t)
			c := dialRaw(t, h)
			tc.send(c)
			var code http2.ErrCode
			c.until("GOAWAY", func(f http2.Frame) bool {
				g, ok := f.(*http2.GoAwayFrame)
				if ok {
					code = g.ErrCode
				}
				return ok
			})
			if code != tc.want {
				t.Errorf("GOAWAY %v, want %v", code, tc.want)
			}
		})
	}
}
