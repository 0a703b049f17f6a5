package epp

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// A gateway for tests: go-control-plane's own client over a real gRPC
// connection (bufconn) to the Endpoint Picker.

type harness struct {
	d    *route.Decider
	s    *Server
	conn *grpc.ClientConn
	log  *recordSink
	l    *Listener
	ln   *bufconn.Listener
}

func newHarness(t *testing.T, yaml string) *harness {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	d, err := route.New(cfg, route.Options{Seed: 42})
	if err != nil {
		t.Fatalf("decider: %v", err)
	}
	t.Cleanup(d.Close)
	rec := &recordSink{}
	d.Ledger().SetRequestSink(rec, 1)
	// The unit tests run against the inline server, epp.server's default
	// (as the e2e tests in test/ but one, which runs on grpc-go);
	// TURNOUT_EPP_SERVER=grpc runs these against grpc-go too.
	s, err := New(d, Options{TLS: config.EPPTLSConfig{Mode: config.EPPTLSOff}, Server: cmp.Or(os.Getenv("TURNOUT_EPP_SERVER"), config.EPPServerInline)})
	if err != nil {
		t.Fatal(err)
	}
	ln := bufconn.Listen(1 << 20)
	l := s.Serve(ln, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l.Shutdown(ctx)
	})
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &harness{d: d, s: s, conn: conn, log: rec, l: l, ln: ln}
}

// gw is one ext_proc stream, as a gateway drives it.
type gw struct {
	t      *testing.T
	c      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (h *harness) open(t *testing.T) *gw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := extprocv3.NewExternalProcessorClient(h.conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &gw{t: t, c: c, cancel: cancel}
}

func (g *gw) send(r *extprocv3.ProcessingRequest) {
	g.t.Helper()
	if err := g.c.Send(r); err != nil {
		g.t.Fatalf("send: %v", err)
	}
}

func (g *gw) recv() *extprocv3.ProcessingResponse {
	g.t.Helper()
	r, err := g.c.Recv()
	if err != nil {
		g.t.Fatalf("recv: %v", err)
	}
	return r
}

// reqHeaders is a request_headers message: pseudo-headers and lower-cased
// names, values in raw_value (as Envoy sends them) except those named
// "value:<name>", sent in value.
func reqHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		if n, ok := strings.CutPrefix(kv[i], "value:"); ok {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: n, Value: kv[i+1]})
			continue
		}
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}}}
}

// chatHeaders are a POST /v1/chat/completions' headers.
func chatHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return reqHeaders(eos, append([]string{":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw.example", ":scheme", "http", "content-type", "application/json"}, kv...)...)
}

func withMode(r *extprocv3.ProcessingRequest, req, resp filterv3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	r.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
	return r
}

// withSubset adds the subset hint (a list of ip:port) to metadata_context.
func withSubset(r *extprocv3.ProcessingRequest, addrs ...string) *extprocv3.ProcessingRequest {
	l := make([]any, len(addrs))
	for i, a := range addrs {
		l[i] = a
	}
	v, err := structpb.NewList(l)
	if err != nil {
		panic(err)
	}
	r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		NSSubset: {Fields: map[string]*structpb.Value{MetaSubset: structpb.NewListValue(v)}},
	}}
	return r
}

func reqBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// sendBody sends b in chunks of n bytes, end_of_stream on the last.
func (g *gw) sendBody(b []byte, n int) int {
	chunks := 0
	for i := 0; i < len(b); i += n {
		g.send(reqBody(b[i:min(i+n, len(b))], i+n >= len(b)))
		chunks++
	}
	return chunks
}

func respHeaders(status, served string, eos bool) *extprocv3.ProcessingRequest {
	r := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: eos, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte(status)}, {Key: "content-type", RawValue: []byte("text/event-stream")},
		}}}}}
	if served != "" {
		r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			NSDestination: {Fields: map[string]*structpb.Value{MetaServed: structpb.NewStringValue(served)}},
		}}
	}
	return r
}

func respBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// pick is what a routed headers (or BUFFERED body) answer says.
type pick struct {
	header, meta string
	clearCache   bool
	contentLen   string
}

func (p pick) addrs() []string { return strings.Split(p.header, ",") }

// routed reads the pick of an answer, failing on anything else.
func routed(t *testing.T, r *extprocv3.ProcessingResponse) pick {
	t.Helper()
	var cr *extprocv3.CommonResponse
	switch x := r.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		cr = x.RequestHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_RequestBody:
		cr = x.RequestBody.GetResponse()
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		t.Fatalf("refused: %d %s", x.ImmediateResponse.GetStatus().GetCode(), x.ImmediateResponse.GetBody())
	default:
		t.Fatalf("not a routed answer: %T", r.Response)
	}
	p := pick{clearCache: cr.GetClearRouteCache()}
	for _, h := range cr.GetHeaderMutation().GetSetHeaders() {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			t.Errorf("header %s is not overwritten: %v", h.GetHeader().GetKey(), h.GetAppendAction())
		}
		switch h.GetHeader().GetKey() {
		case HdrDestination:
			p.header = string(h.GetHeader().GetRawValue())
		case "content-length":
			p.contentLen = string(h.GetHeader().GetRawValue())
		}
	}
	p.meta = r.GetDynamicMetadata().GetFields()[NSDestination].GetStructValue().GetFields()[MetaDestination].GetStringValue()
	return p
}

// refusal is an ImmediateResponse's content.
type refusal struct {
	status               int
	reason, code, retry  string
	contentType, details string
}

func refused(t *testing.T, r *extprocv3.ProcessingResponse) refusal {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("not an ImmediateResponse: %v", r)
	}
	f := refusal{status: int(ir.GetStatus().GetCode()), details: ir.GetDetails()}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		switch strings.ToLower(h.GetHeader().GetKey()) {
		case "x-turnout-reason":
			f.reason = string(h.GetHeader().GetRawValue())
		case "retry-after":
			f.retry = string(h.GetHeader().GetRawValue())
		case "content-type":
			f.contentType = string(h.GetHeader().GetRawValue())
		}
	}
	var e struct {
		Error struct{ Code, Type, Message string } `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &e); err != nil {
		t.Fatalf("body %q is not turnout's JSON error: %v", ir.GetBody(), err)
	}
	f.code = e.Error.Code
	return f
}

// streamedChunk reads a streamed body answer (request or response side).
func streamedChunk(t *testing.T, r *extprocv3.ProcessingResponse) ([]byte, bool) {
	t.Helper()
	var br *extprocv3.BodyResponse
	switch x := r.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestBody:
		br = x.RequestBody
	case *extprocv3.ProcessingResponse_ResponseBody:
		br = x.ResponseBody
	default:
		t.Fatalf("not a body answer: %T", r.Response)
	}
	sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		t.Fatalf("body answer without a streamed_response: %v", br)
	}
	return sr.GetBody(), sr.GetEndOfStream()
}

// recordSink keeps the request log's records.
type recordSink struct {
	mu   sync.Mutex
	recs []route.DecisionRecord
}

func (r *recordSink) Request(rec *route.DecisionRecord) {
	r.mu.Lock()
	r.recs = append(r.recs, *rec)
	r.mu.Unlock()
}

func (r *recordSink) all() []route.DecisionRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]route.DecisionRecord(nil), r.recs...)
}

// eventually retries f until it succeeds or d passes.
func eventually(t *testing.T, d time.Duration, f func() error) {
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
		time.Sleep(10 * time.Millisecond)
	}
}

// chat is a chat request, the model first (as clients send it).
func chat(model, user string) []byte {
	u, _ := json.Marshal(user)
	return fmt.Appendf(nil, `{"model":%q,"stream":true,"messages":[{"role":"user","content":%s}]}`, model, u)
}

// fleetYAML: session-hash "llama" (4 replicas, 2 fallbacks) and
// round-robin "qwen" (2), a draining-only "gone", a model header.
const fleetYAML = `
session_headers: [x-session-id]
model_headers: [x-model]
fallbacks: 2
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: session-hash}
    pools:
      - endpoints:
          - {name: a, address: 10.0.0.1:8000}
          - {name: b, address: 10.0.0.2:8000}
          - {name: c, address: 10.0.0.3:8000}
          - {name: d, address: 10.0.0.4:8000}
  - name: qwen
    models: [qwen]
    policy: {name: round-robin}
    pools:
      - endpoints:
          - {name: q0, address: 10.0.1.1:8000}
          - {name: q1, address: 10.0.1.2:8000}
  - name: gone
    models: [gone]
    pools:
      - endpoints:
          - {name: g0, address: 10.0.2.1:8000, draining: true}
`

var llamaAddrs = []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}
