package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/turnout/turnout/route/epp"
)

// EnvoyGateway is an Envoy ext_proc filter with the Endpoint Picker's
// settings, as Envoy-based gateways (Istio, kgateway, Envoy AI Gateway,
// GKE) drive it: one gRPC connection for every request, a stream per
// request, the request proxied to the pick by the gateway itself (down
// the list on a connection failure) and the response sent back through
// the response phase with the endpoint that served it. The e2e tests and
// the replay's epp seat both drive turnout through it.
type EnvoyGateway struct {
	ext      extprocv3.ExternalProcessorClient
	upstream *http.Client
}

// NewEnvoyGateway asks the Endpoint Picker on cc and proxies to the
// replicas with upstream.
func NewEnvoyGateway(cc grpc.ClientConnInterface, upstream *http.Client) *EnvoyGateway {
	return &EnvoyGateway{ext: extprocv3.NewExternalProcessorClient(cc), upstream: upstream}
}

// GatewayBodyChunk is the size of the body chunks Envoy sends in streamed
// modes (its default buffer).
const GatewayBodyChunk = 64 << 10

// GatewayMode is the filter's processing_mode for both bodies.
type GatewayMode int

// The body modes the Endpoint Picker's gateways configure.
const (
	GatewayFullDuplex GatewayMode = iota // FULL_DUPLEX_STREAMED
	GatewayBuffered                      // BUFFERED
)

func (m GatewayMode) send() filterv3.ProcessingMode_BodySendMode {
	if m == GatewayBuffered {
		return filterv3.ProcessingMode_BUFFERED
	}
	return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// GatewayRequest is one downstream request through the gateway.
type GatewayRequest struct {
	Method, Path string // default POST /v1/chat/completions
	Header       http.Header
	Body         []byte
	Mode         GatewayMode
	// Subset, when not nil, is sent as the subset hint (empty: a hint
	// naming nothing).
	Subset []string
}

// GatewayPick is what the request phase answered.
type GatewayPick struct {
	Dest []string // the header's endpoints, primary first
	// Refused is the ImmediateResponse's status (0: routed), with its
	// x-turnout-reason, retry-after and body.
	Refused            int
	Reason, RetryAfter string
	Body               []byte
}

// GatewayResult is a request's outcome downstream.
type GatewayResult struct {
	GatewayPick
	Served   string // the endpoint that answered
	Replica  string // its X-Replica header (the mock's name)
	Status   int    // the replica's status
	Sent     []byte // the request body sent to the replica
	Upstream []byte // the replica's body as it sent it
	Passed   []byte // the body the gateway got back through ext_proc
	// FirstPassed is when the first byte of the response body came back
	// through ext_proc: when the client would see it.
	FirstPassed time.Time
}

// GatewayStream is one request's ext_proc stream after the request phase.
type GatewayStream struct {
	// Pick is the request phase's answer.
	Pick   GatewayPick
	g      *EnvoyGateway
	req    GatewayRequest
	c      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	body   []byte // the request body as the Endpoint Picker passed it on
	sendEr chan error
}

// Do runs a request through: the request phase, then (when routed) the
// upstream exchange and the response phase.
func (g *EnvoyGateway) Do(ctx context.Context, r GatewayRequest) (*GatewayResult, error) {
	s, err := g.Pick(ctx, r)
	if err != nil {
		return nil, err
	}
	return s.Finish()
}

// Pick runs the request phase: headers as Envoy sends them, the body in
// 64 KiB chunks (full duplex, sent while answers come back) or whole after
// the headers answer (buffered); it checks the pick's header and dynamic
// metadata agree.
func (g *EnvoyGateway) Pick(ctx context.Context, r GatewayRequest) (*GatewayStream, error) {
	if r.Method == "" {
		r.Method = http.MethodPost
	}
	if r.Path == "" {
		r.Path = "/v1/chat/completions"
	}
	ctx, cancel := context.WithCancel(ctx)
	c, err := g.ext.Process(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open the stream: %w", err)
	}
	s := &GatewayStream{g: g, req: r, c: c, cancel: cancel, sendEr: make(chan error, 1)}
	if err := s.requestPhase(); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

func (s *GatewayStream) requestPhase() error {
	r := s.req
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte("gateway.example")},
		{Key: ":path", RawValue: []byte(r.Path)},
		{Key: ":method", RawValue: []byte(r.Method)},
		{Key: ":scheme", RawValue: []byte("http")},
	}}
	for k, vs := range r.Header {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	if len(r.Body) > 0 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(r.Body)))})
	}
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: hm, EndOfStream: len(r.Body) == 0,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: r.Mode.send(), ResponseBodyMode: r.Mode.send()},
	}
	if r.Subset != nil {
		first.MetadataContext = subsetMetadata(r.Subset)
	}
	if err := s.c.Send(first); err != nil {
		return fmt.Errorf("send request_headers: %w", err)
	}
	if len(r.Body) == 0 {
		a, err := s.c.Recv()
		if err != nil {
			return fmt.Errorf("headers answer: %w", err)
		}
		return s.readPick(a, a.GetRequestHeaders().GetResponse())
	}
	if r.Mode == GatewayBuffered {
		a, err := s.c.Recv()
		if err != nil {
			return fmt.Errorf("headers answer: %w", err)
		}
		if a.GetImmediateResponse() != nil {
			return s.readPick(a, nil)
		}
		if a.GetRequestHeaders() == nil {
			return fmt.Errorf("buffered: the headers were answered with %T", a.Response)
		}
		if err := s.c.Send(RequestBodyMessage(r.Body, true)); err != nil {
			return fmt.Errorf("send the body: %w", err)
		}
		if a, err = s.c.Recv(); err != nil {
			return fmt.Errorf("body answer: %w", err)
		}
		if err := s.readPick(a, a.GetRequestBody().GetResponse()); err != nil {
			return err
		}
		s.body = applyBodyMutation(r.Body, a.GetRequestBody().GetResponse())
		return nil
	}
	// Full duplex: chunks go out while answers come in (a large body is
	// answered before it has all been sent).
	go func() {
		var err error
		for i := 0; i < len(r.Body) && err == nil; i += GatewayBodyChunk {
			end := min(i+GatewayBodyChunk, len(r.Body))
			err = s.c.Send(RequestBodyMessage(r.Body[i:end], end == len(r.Body)))
		}
		s.sendEr <- err
	}()
	a, err := s.c.Recv()
	if err != nil {
		return fmt.Errorf("headers answer: %w", err)
	}
	if err := s.readPick(a, a.GetRequestHeaders().GetResponse()); err != nil || s.Pick.Refused != 0 {
		return err
	}
	if err := s.recvStreamed("request", (*extprocv3.ProcessingResponse).GetRequestBody, func(b []byte) { s.body = append(s.body, b...) }); err != nil {
		return err
	}
	if err := <-s.sendEr; err != nil {
		return fmt.Errorf("send the body: %w", err)
	}
	return nil
}

// readPick reads a routed answer (cr: its common response) or a refusal;
// the header and the envoy.lb metadata must say the same.
func (s *GatewayStream) readPick(a *extprocv3.ProcessingResponse, cr *extprocv3.CommonResponse) error {
	if ir := a.GetImmediateResponse(); ir != nil {
		p := GatewayPick{Refused: int(ir.GetStatus().GetCode()), Body: ir.GetBody()}
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			switch strings.ToLower(h.GetHeader().GetKey()) {
			case "x-turnout-reason":
				p.Reason = string(h.GetHeader().GetRawValue())
			case "retry-after":
				p.RetryAfter = string(h.GetHeader().GetRawValue())
			}
		}
		s.Pick = p
		return nil
	}
	if cr == nil {
		return fmt.Errorf("expected the pick, got %T", a.Response)
	}
	var hdr string
	for _, h := range cr.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.HdrDestination {
			hdr = string(h.GetHeader().GetRawValue())
		}
	}
	meta := a.GetDynamicMetadata().GetFields()[epp.NSDestination].GetStructValue().GetFields()[epp.MetaDestination].GetStringValue()
	if hdr == "" || hdr != meta {
		return fmt.Errorf("header %s %q and metadata %s.%s %q differ", epp.HdrDestination, hdr, epp.NSDestination, epp.MetaDestination, meta)
	}
	if !cr.GetClearRouteCache() {
		return errors.New("the pick does not clear the route cache: Envoy would route on the old one")
	}
	for a := range strings.SplitSeq(hdr, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("%q in the pick %q is not ip:port", a, hdr)
		}
		s.Pick.Dest = append(s.Pick.Dest, a)
	}
	return nil
}

// Finish proxies a routed request to its pick, going down the list on a
// connection failure as Envoy's retry does, and sends the response through
// the response phase (the served endpoint in envoy.lb metadata), reading
// the passed-back chunks; a refusal just closes the stream.
func (s *GatewayStream) Finish() (*GatewayResult, error) {
	defer s.cancel()
	res := &GatewayResult{GatewayPick: s.Pick, Sent: s.body}
	if s.Pick.Refused != 0 {
		return res, nil
	}
	resp, err := s.proxy(res)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if err := s.responsePhase(res, resp); err != nil {
		return res, err
	}
	if err := s.c.CloseSend(); err != nil {
		return res, err
	}
	// The Endpoint Picker ends the stream once the gateway has.
	if a, err := s.c.Recv(); err != io.EOF {
		return res, fmt.Errorf("after the response: %v, %v (want the end of the stream)", a, err)
	}
	return res, nil
}

func (s *GatewayStream) proxy(res *GatewayResult) (*http.Response, error) {
	var errs []error
	for _, dest := range s.Pick.Dest {
		req, err := http.NewRequestWithContext(s.c.Context(), s.req.Method, "http://"+dest+s.req.Path, bytes.NewReader(s.body))
		if err != nil {
			return nil, err
		}
		req.Header = s.req.Header.Clone()
		if req.Header == nil {
			req.Header = http.Header{}
		}
		req.Header.Set(epp.HdrDestination, strings.Join(s.Pick.Dest, ","))
		resp, err := s.g.upstream.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res.Served, res.Replica, res.Status = dest, resp.Header.Get("X-Replica"), resp.StatusCode
		return resp, nil
	}
	return nil, fmt.Errorf("every endpoint of the pick failed: %w", errors.Join(errs...))
}

func (s *GatewayStream) responsePhase(res *GatewayResult, resp *http.Response) error {
	served := servedMetadata(res.Served)
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(resp.StatusCode))}}}
	for k, vs := range resp.Header {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	if err := s.c.Send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm}},
		MetadataContext: served,
	}); err != nil {
		return fmt.Errorf("send response_headers: %w", err)
	}
	if _, err := answer(s, "response headers", (*extprocv3.ProcessingResponse).GetResponseHeaders); err != nil {
		return err
	}
	if s.req.Mode == GatewayBuffered {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("read the replica: %w", err)
		}
		res.Upstream = b
		if err := s.c.Send(responseBodyMessage(b, true, served)); err != nil {
			return fmt.Errorf("send the response body: %w", err)
		}
		rb, err := answer(s, "response body", (*extprocv3.ProcessingResponse).GetResponseBody)
		if err != nil {
			return err
		}
		res.Passed = applyBodyMutation(b, rb.GetResponse())
		res.FirstPassed = time.Now()
		return nil
	}
	// Full duplex: each chunk the replica sends goes out as it comes; the
	// end of its body is an empty chunk with end_of_stream. Upstream is
	// the sender's until it reports on sendEr.
	go func() {
		buf := make([]byte, 16<<10)
		var err error
		for err == nil {
			n, rerr := resp.Body.Read(buf)
			if n > 0 {
				chunk := append([]byte(nil), buf[:n]...)
				res.Upstream = append(res.Upstream, chunk...)
				err = s.c.Send(responseBodyMessage(chunk, false, served))
			}
			if rerr == io.EOF {
				err = s.c.Send(responseBodyMessage(nil, true, served))
				break
			}
			if rerr != nil && err == nil {
				err = fmt.Errorf("read the replica: %w", rerr)
			}
		}
		s.sendEr <- err
	}()
	err := s.recvStreamed("response", (*extprocv3.ProcessingResponse).GetResponseBody, func(b []byte) {
		if len(b) > 0 && res.FirstPassed.IsZero() {
			res.FirstPassed = time.Now()
		}
		res.Passed = append(res.Passed, b...)
	})
	if err != nil {
		return err
	}
	return <-s.sendEr
}

// answer reads the next answer, which must carry the part get returns
// (what names it in errors).
func answer[T any](s *GatewayStream, what string, get func(*extprocv3.ProcessingResponse) *T) (*T, error) {
	a, err := s.c.Recv()
	if err != nil {
		return nil, fmt.Errorf("%s answer: %w", what, err)
	}
	part := get(a)
	if part == nil {
		return nil, fmt.Errorf("%s answered with %T", what, a.Response)
	}
	return part, nil
}

// recvStreamed reads the full-duplex answers to one body (which: request
// or response) up to end_of_stream, handing each passed-back chunk to add.
func (s *GatewayStream) recvStreamed(which string, body func(*extprocv3.ProcessingResponse) *extprocv3.BodyResponse, add func([]byte)) error {
	for {
		a, err := s.c.Recv()
		if err != nil {
			return fmt.Errorf("%s body chunk: %w", which, err)
		}
		sr := body(a).GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return fmt.Errorf("full duplex: a %s body answer without a streamed_response: %v", which, a)
		}
		add(sr.GetBody())
		if sr.GetEndOfStream() {
			return nil
		}
	}
}

// applyBodyMutation is the body Envoy goes on with after a buffered body
// answer: unchanged, replaced, or cleared.
func applyBodyMutation(b []byte, cr *extprocv3.CommonResponse) []byte {
	switch m := cr.GetBodyMutation().GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return m.Body
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			return nil
		}
	}
	return b
}

// RequestBodyMessage is a request_body message of the ext_proc stream.
func RequestBodyMessage(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func responseBodyMessage(b []byte, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}},
		MetadataContext: md,
	}
}

// subsetMetadata is the subset hint as the protocol spells it: a list of
// ip:port under envoy.lb.subset_hint.
func subsetMetadata(addrs []string) *corev3.Metadata {
	l := make([]*structpb.Value, len(addrs))
	for i, a := range addrs {
		l[i] = structpb.NewStringValue(a)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		epp.NSSubset: {Fields: map[string]*structpb.Value{epp.MetaSubset: structpb.NewListValue(&structpb.ListValue{Values: l})}},
	}}
}

// servedMetadata reports the endpoint that answered under envoy.lb.
func servedMetadata(addr string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		epp.NSDestination: {Fields: map[string]*structpb.Value{epp.MetaServed: structpb.NewStringValue(addr)}},
	}}
}
