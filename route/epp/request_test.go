package epp

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnout/turnout/route/contract"
)

// FULL_DUPLEX_STREAMED, as llm-d's guides configure Envoy: headers, then
// the body in 64 KiB chunks with end_of_stream on the last. The headers
// answer (the pick) comes first, then every chunk as it came, the last
// with end_of_stream; content-length is the gateway's.
func TestEPP_FullDuplexBodyIn64KiBChunks(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	body := chat("llama", strings.Repeat("tell me a long story ", 9000)) // ~190 KiB
	g.send(chatHeaders(false, "content-length", strconv.Itoa(len(body)), "value:x-session-id", "s1"))
	n := g.sendBody(body, 64<<10)
	if n < 3 {
		t.Fatalf("%d chunks: the body should span several", n)
	}
	p := routed(t, g.recv())
	if !slices.Contains(llamaAddrs, p.addrs()[0]) || !p.clearCache || p.contentLen != strconv.Itoa(len(body)) {
		t.Fatalf("pick %+v", p)
	}
	var got []byte
	for i := range n {
		b, eos := streamedChunk(t, g.recv())
		if eos != (i == n-1) {
			t.Fatalf("chunk %d end_of_stream %v", i, eos)
		}
		got = append(got, b...)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("body passed back differs: %d bytes, want %d", len(got), len(body))
	}
}

// The protocol: the header and the envoy.lb metadata carry the same
// value, the primary first.
func TestEPP_HeaderEqualsMetadataPrimary(t *testing.T) {
	h := newHarness(t, fleetYAML)
	for i := range 8 {
		g := h.open(t)
		g.send(chatHeaders(false, "x-session-id", fmt.Sprint("user-", i)))
		g.sendBody(chat("llama", "hi"), 64<<10)
		p := routed(t, g.recv())
		if p.header == "" || p.header != p.meta {
			t.Fatalf("header %q, metadata %q", p.header, p.meta)
		}
		if !slices.Contains(llamaAddrs, p.addrs()[0]) {
			t.Fatalf("primary %q is not a llama endpoint", p.addrs()[0])
		}
	}
}

// The fallbacks follow the primary in turnout's order: the same list the
// Decider gives /internal/route (Server, then Fallbacks), as addresses.
func TestEPP_FallbacksInOrder(t *testing.T) {
	h := newHarness(t, fleetYAML)
	addrOf := map[string]string{"a": llamaAddrs[0], "b": llamaAddrs[1], "c": llamaAddrs[2], "d": llamaAddrs[3]}
	for i := range 6 {
		session := fmt.Sprint("session-", i)
		var in contract.Input
		in.AddHeader([]byte("x-session-id"), []byte(session))
		in.Body = chat("llama", "hi")
		var v contract.Verdict
		h.d.Decide(&in, &v)
		want := []string{addrOf[string(v.Server)]}
		for _, f := range v.Fallbacks {
			want = append(want, addrOf[string(f)])
		}
		h.d.Ledger().Complete(v.Decision)

		g := h.open(t)
		g.send(chatHeaders(false, "x-session-id", session))
		g.sendBody(chat("llama", "hi"), 64<<10)
		p := routed(t, g.recv())
		if len(want) != 3 || !slices.Equal(p.addrs(), want) {
			t.Fatalf("session %s: EPP %v, Decider %v", session, p.addrs(), want)
		}
	}
}

// The subset hint MUST be honoured: whatever endpoint alone is hinted is
// the pick, and a hint of two keeps every listed endpoint within them.
func TestEPP_MustHonourSubsetHint(t *testing.T) {
	h := newHarness(t, fleetYAML)
	for _, only := range llamaAddrs {
		for i := range 3 { // sessions that would hash elsewhere
			g := h.open(t)
			g.send(withSubset(chatHeaders(false, "x-session-id", fmt.Sprint("s", i)), only))
			g.sendBody(chat("llama", "hi"), 64<<10)
			if p := routed(t, g.recv()); !slices.Equal(p.addrs(), []string{only}) {
				t.Fatalf("hint %s: picked %v", only, p.addrs())
			}
		}
	}
	two := llamaAddrs[1:3]
	for i := range 8 {
		g := h.open(t)
		g.send(withSubset(chatHeaders(false, "x-session-id", fmt.Sprint("t", i)), two...))
		g.sendBody(chat("llama", "hi"), 64<<10)
		p := routed(t, g.recv())
		for _, a := range p.addrs() {
			if !slices.Contains(two, a) {
				t.Fatalf("hint %v: picked %v", two, p.addrs())
			}
		}
	}
}

// An empty hint, or one naming nothing of the model's pool, is a 503
// ImmediateResponse, never a pick outside it.
func TestEPP_MustReturn503WhenSubsetEmpty(t *testing.T) {
	h := newHarness(t, fleetYAML)
	for _, tc := range []struct {
		name  string
		addrs []string
	}{
		{"empty list", nil},
		{"unknown addresses", []string{"10.9.9.9:8000"}},
		{"another model's endpoints", []string{"10.0.1.1:8000", "10.0.1.2:8000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := h.open(t)
			g.send(withSubset(chatHeaders(false), tc.addrs...))
			g.sendBody(chat("llama", "hi"), 64<<10)
			f := refused(t, g.recv())
			if f.status != 503 || f.reason != contract.ReasonSubsetEmpty || f.code != contract.ReasonSubsetEmpty {
				t.Fatalf("%+v", f)
			}
		})
	}
}

// Decided on the headers alone (end_of_stream on request_headers): the
// model comes from a model header, the pick in the headers answer.
func TestEPP_HeadersOnlyDecision(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	g.send(reqHeaders(true, ":method", "GET", ":path", "/v1/models", ":authority", "gw", "x-model", "qwen"))
	p := routed(t, g.recv())
	if a := p.addrs()[0]; a != "10.0.1.1:8000" && a != "10.0.1.2:8000" {
		t.Fatalf("picked %v, want a qwen endpoint", p.addrs())
	}
	if p.contentLen != "" {
		t.Fatalf("content-length %q set on a request without a body", p.contentLen)
	}
}

// Header values may come in value rather than raw_value.
func TestEPP_HeaderValueOrRawValue(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	g.send(reqHeaders(true, ":method", "GET", "value::path", "/v1/models", "value:x-model", "qwen"))
	if a := routed(t, g.recv()).addrs()[0]; !strings.HasPrefix(a, "10.0.1.") {
		t.Fatalf("picked %s, want a qwen endpoint (model from value)", a)
	}
}

// BUFFERED: the headers are answered at once, the whole body's answer
// carries the pick and leaves the body as it is.
func TestEPP_BufferedBody(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	body := chat("qwen", "hi")
	g.send(withMode(chatHeaders(false), filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE))
	r := g.recv()
	if hr := r.GetRequestHeaders(); hr == nil || hr.GetResponse().GetHeaderMutation() != nil {
		t.Fatalf("headers answer %v, want a plain continue", r)
	}
	g.send(reqBody(body, true))
	r = g.recv()
	p := routed(t, r)
	if !strings.HasPrefix(p.header, "10.0.1.") || p.header != p.meta || p.contentLen != strconv.Itoa(len(body)) {
		t.Fatalf("pick %+v", p)
	}
	if r.GetRequestBody().GetResponse().GetBodyMutation() != nil {
		t.Fatal("the BUFFERED body was mutated")
	}
}

// A body over max_body is decided on its first max_body bytes as soon as
// they arrived; every chunk still passes back whole, in order.
func TestEPP_BodyOverMaxBody(t *testing.T) {
	h := newHarness(t, "max_body: 4096\nroute_body: 4096\n"+fleetYAML)
	g := h.open(t)
	body := chat("qwen", strings.Repeat("x", 20000))
	const n = 3000
	g.send(chatHeaders(false))
	g.send(reqBody(body[:n], false))
	g.send(reqBody(body[n:2*n], false)) // past max_body: decided now
	p := routed(t, g.recv())
	if !strings.HasPrefix(p.header, "10.0.1.") || p.contentLen != "" {
		t.Fatalf("pick %+v (no content-length: the body was not seen whole)", p)
	}
	var got []byte
	for range 2 {
		b, eos := streamedChunk(t, g.recv())
		if eos {
			t.Fatal("end_of_stream on a held chunk")
		}
		got = append(got, b...)
	}
	for i := 2 * n; i < len(body); i += n {
		last := i+n >= len(body)
		g.send(reqBody(body[i:min(i+n, len(body))], last))
		b, eos := streamedChunk(t, g.recv())
		if eos != last {
			t.Fatalf("end_of_stream %v at %d", eos, i)
		}
		got = append(got, b...)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("body passed back differs: %d bytes, want %d", len(got), len(body))
	}
}

// Refusals are ImmediateResponses with turnout's status, JSON error and
// x-turnout-reason; no ready endpoint is 503.
func TestEPP_RefusalsAreImmediateResponses(t *testing.T) {
	h := newHarness(t, fleetYAML)
	for _, tc := range []struct {
		name   string
		body   []byte
		status int
		reason string
	}{
		{"unknown model", chat("nope", "hi"), 404, "model_not_found"},
		{"no model with several deployments", []byte(`{"prompt":"hi"}`), 400, "model_required"},
		{"no ready endpoint", chat("gone", "hi"), 503, contract.ReasonNoEndpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := h.open(t)
			g.send(chatHeaders(false))
			g.sendBody(tc.body, 64<<10)
			f := refused(t, g.recv())
			if f.status != tc.status || f.reason != tc.reason || f.code != tc.reason || f.contentType != "application/json" || strings.ContainsAny(f.details, " \t") {
				t.Fatalf("%+v, want %d %s", f, tc.status, tc.reason)
			}
			if _, err := g.c.Recv(); err == nil {
				t.Fatal("the stream goes on after an ImmediateResponse")
			}
		})
	}
}

// Prefill/decode deployments are refused clearly (501), not half-routed.
func TestEPP_PrefillDecodeRefused(t *testing.T) {
	h := newHarness(t, `
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    pools:
      - {role: prefill, endpoints: [{name: p0, address: 10.0.3.1:8000}]}
      - {role: decode, endpoints: [{name: d0, address: 10.0.3.2:8000}]}
`)
	g := h.open(t)
	g.send(chatHeaders(false))
	g.sendBody(chat("llama", "hi"), 64<<10)
	if f := refused(t, g.recv()); f.status != 501 || f.reason != ReasonPD {
		t.Fatalf("%+v", f)
	}
}

// A body mode the Endpoint Picker cannot serve is refused at the headers.
func TestEPP_UnsupportedBodyModeRefused(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	g.send(withMode(chatHeaders(false), filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_NONE))
	if f := refused(t, g.recv()); f.status != 500 || f.reason != ReasonBodyMode {
		t.Fatalf("%+v", f)
	}
}

// A malformed stream ends with InvalidArgument naming the problem, not a hang.
func TestEPP_MalformedStreamIsAnError(t *testing.T) {
	h := newHarness(t, fleetYAML)
	for _, tc := range []struct {
		name string
		msgs []*extprocv3.ProcessingRequest
		want string
	}{
		{"body before headers", []*extprocv3.ProcessingRequest{reqBody([]byte("{}"), true)}, "request_body came before request_headers"},
		{"unknown phase", []*extprocv3.ProcessingRequest{{}}, "without a known phase"},
		{"headers twice", []*extprocv3.ProcessingRequest{chatHeaders(false), chatHeaders(false)}, "request_headers came twice"},
		{"trailers before headers", []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}}, "request_trailers came before"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := h.open(t)
			for _, m := range tc.msgs {
				g.send(m)
			}
			_, err := g.c.Recv()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("err %v, want InvalidArgument %q", err, tc.want)
			}
		})
	}
}

// The bytes held before a decision count against
// limits.max_buffered_bytes with turnout's other buffered bodies: past it,
// 503 overloaded, and the bytes go back when the streams end.
func TestEPP_BufferedBytesBudget(t *testing.T) {
	h := newHarness(t, "max_body: 4096\nroute_body: 4096\nlimits: {max_buffered_bytes: 4096}\n"+fleetYAML)
	first := h.open(t)
	first.send(chatHeaders(false))
	first.send(reqBody(bytes.Repeat([]byte("x"), 3000), false))
	eventually(t, 10*time.Second, func() error {
		if n := h.s.budget.used.Load(); n != 3000 {
			return fmt.Errorf("%d bytes held, want the first stream's 3000", n)
		}
		return nil
	})
	second := h.open(t)
	second.send(chatHeaders(false))
	second.send(reqBody(bytes.Repeat([]byte("y"), 3000), false))
	f := refused(t, second.recv())
	if f.status != 503 || f.reason != contract.ReasonOverloaded || f.retry == "" {
		t.Fatalf("%+v", f)
	}
	first.cancel()
	eventually(t, 10*time.Second, func() error {
		if n := h.s.budget.used.Load(); n != 0 {
			return fmt.Errorf("%d bytes still held", n)
		}
		return nil
	})
}

// epp.fallbacks caps the list for gateways that proxy to the header's value
// as one address (NGINX Gateway Fabric): 0 lists the primary alone, 1 the
// primary and the first fallback, in both the header and the metadata.
func TestEPP_FallbacksCapped(t *testing.T) {
	for _, n := range []int{0, 1} {
		h := newHarness(t, fmt.Sprintf("epp: {fallbacks: %d}\n", n)+fleetYAML)
		var in contract.Input
		in.AddHeader([]byte("x-session-id"), []byte("s"))
		in.Body = chat("llama", "hi")
		var v contract.Verdict
		h.d.Decide(&in, &v)
		h.d.Ledger().Complete(v.Decision)
		if len(v.Fallbacks) != 2 {
			t.Fatalf("the decision names %d fallbacks, want 2", len(v.Fallbacks))
		}
		g := h.open(t)
		g.send(chatHeaders(false, "x-session-id", "s"))
		g.sendBody(chat("llama", "hi"), 64<<10)
		p := routed(t, g.recv())
		if got := p.addrs(); len(got) != 1+n || p.header != p.meta {
			t.Fatalf("fallbacks %d: header %q, metadata %q", n, p.header, p.meta)
		}
	}
}
