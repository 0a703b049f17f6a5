//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/turnout/turnout/route/epp"
)

// Gateways in front of turnout's Endpoint Picker, as the real ones drive
// the ext_proc stream: an Envoy-based one (Istio, kgateway, Envoy AI
// Gateway, GKE), which holds one gRPC connection, asks per request, proxies
// to the pick itself and reports the response back; and NGINX Gateway
// Fabric's shim (ngfPick), which dials per request and reads only the pick.

// eppBodyChunk is the size of the body chunks Envoy sends in streamed
// modes (its default buffer).
const eppBodyChunk = 64 << 10

// eppDial is a gateway's connection to the Endpoint Picker: TLS against
// the self-signed certificate, not verified, as the reference setups do.
func eppDial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// envoyGateway is an Envoy ext_proc filter with the Endpoint Picker's
// settings: one connection for every request, a stream per request.
type envoyGateway struct {
	ext      extprocv3.ExternalProcessorClient
	upstream *http.Client
}

func newEnvoyGateway(t testing.TB, eppAddr string) *envoyGateway {
	tr := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &envoyGateway{
		ext:      extprocv3.NewExternalProcessorClient(eppDial(t, eppAddr)),
		upstream: &http.Client{Transport: tr, Timeout: 30 * time.Second},
	}
}

// eppMode is the filter's processing_mode for the bodies.
type eppMode struct {
	req, resp filterv3.ProcessingMode_BodySendMode
}

var (
	modeFullDuplex = eppMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	modeBuffered   = eppMode{filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED}
)

// gwRequest is one downstream request through the gateway.
type gwRequest struct {
	Method, Path string // default POST /v1/chat/completions
	Header       map[string]string
	Body         []byte
	Mode         eppMode
	// Subset, when not nil, is sent as the subset hint (empty: a hint
	// naming nothing).
	Subset []string
}

// chatRequest is a streamed chat completion of user's text.
func chatRequest(user string, hdr ...string) gwRequest {
	b, _ := json.Marshal(map[string]any{
		"model": "llama", "stream": true, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": user}},
	})
	h := map[string]string{"content-type": "application/json"}
	for i := 0; i+1 < len(hdr); i += 2 {
		h[hdr[i]] = hdr[i+1]
	}
	return gwRequest{Header: h, Body: b, Mode: modeFullDuplex}
}

// gwPick is what the request phase answered.
type gwPick struct {
	Dest []string // the header's endpoints, primary first
	// Refused is the ImmediateResponse's status (0: routed), with its
	// x-turnout-reason, retry-after and body.
	Refused            int
	Reason, RetryAfter string
	Body               []byte
}

// gwResult is a request's outcome downstream.
type gwResult struct {
	gwPick
	Served   string // the endpoint that answered
	Replica  string // its X-Replica header (the mock's name)
	Status   int    // the replica's status
	Sent     []byte // the request body sent to the replica
	Upstream []byte // the replica's body as it sent it
	Passed   []byte // the body the gateway got back through ext_proc
	Events   chatEvents
}

// gwStream is one request's ext_proc stream after the request phase.
type gwStream struct {
	g      *envoyGateway
	req    gwRequest
	c      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	pick   gwPick
	body   []byte // the request body as the Endpoint Picker passed it on
	sendEr chan error
}

// Do runs a request through: the request phase, then (when routed) the
// upstream exchange and the response phase.
func (g *envoyGateway) Do(ctx context.Context, r gwRequest) (*gwResult, error) {
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
func (g *envoyGateway) Pick(ctx context.Context, r gwRequest) (*gwStream, error) {
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
	s := &gwStream{g: g, req: r, c: c, cancel: cancel, sendEr: make(chan error, 1)}
	if err := s.requestPhase(); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

func (s *gwStream) requestPhase() error {
	r := s.req
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte("gateway.example")},
		{Key: ":path", RawValue: []byte(r.Path)},
		{Key: ":method", RawValue: []byte(r.Method)},
		{Key: ":scheme", RawValue: []byte("http")},
	}}
	for k, v := range r.Header {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
	}
	if len(r.Body) > 0 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(r.Body)))})
	}
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: hm, EndOfStream: len(r.Body) == 0,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: r.Mode.req, ResponseBodyMode: r.Mode.resp},
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
	switch r.Mode.req {
	case filterv3.ProcessingMode_BUFFERED:
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
		if err := s.c.Send(bodyMsg(r.Body, true)); err != nil {
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
	default:
		// Full duplex: chunks go out while answers come in (a large body
		// is answered before it has all been sent).
		go func() {
			var err error
			for i := 0; i < len(r.Body) && err == nil; i += eppBodyChunk {
				end := min(i+eppBodyChunk, len(r.Body))
				err = s.c.Send(bodyMsg(r.Body[i:end], end == len(r.Body)))
			}
			s.sendEr <- err
		}()
		a, err := s.c.Recv()
		if err != nil {
			return fmt.Errorf("headers answer: %w", err)
		}
		if err := s.readPick(a, a.GetRequestHeaders().GetResponse()); err != nil || s.pick.Refused != 0 {
			return err
		}
		for {
			a, err := s.c.Recv()
			if err != nil {
				return fmt.Errorf("request body chunk: %w", err)
			}
			sr := a.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return fmt.Errorf("full duplex: a request body answer without a streamed_response: %v", a)
			}
			s.body = append(s.body, sr.GetBody()...)
			if sr.GetEndOfStream() {
				break
			}
		}
		if err := <-s.sendEr; err != nil {
			return fmt.Errorf("send the body: %w", err)
		}
		return nil
	}
}

// readPick reads a routed answer (cr: its common response) or a refusal;
// the header and the envoy.lb metadata must say the same.
func (s *gwStream) readPick(a *extprocv3.ProcessingResponse, cr *extprocv3.CommonResponse) error {
	if ir := a.GetImmediateResponse(); ir != nil {
		p := gwPick{Refused: int(ir.GetStatus().GetCode()), Body: ir.GetBody()}
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			switch strings.ToLower(h.GetHeader().GetKey()) {
			case "x-turnout-reason":
				p.Reason = string(h.GetHeader().GetRawValue())
			case "retry-after":
				p.RetryAfter = string(h.GetHeader().GetRawValue())
			}
		}
		s.pick = p
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
		s.pick.Dest = append(s.pick.Dest, a)
	}
	return nil
}

// Finish proxies a routed request to its pick, going down the list on a
// connection failure as Envoy's retry does, and sends the response through
// the response phase (the served endpoint in envoy.lb metadata), reading
// the passed-back chunks; a refusal just closes the stream.
func (s *gwStream) Finish() (*gwResult, error) {
	defer s.cancel()
	res := &gwResult{gwPick: s.pick, Sent: s.body}
	if s.pick.Refused != 0 {
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
	ev, err := readChatEvents(bytes.NewReader(res.Passed))
	res.Events = ev
	return res, err
}

func (s *gwStream) proxy(res *gwResult) (*http.Response, error) {
	var errs []error
	for _, dest := range s.pick.Dest {
		req, err := http.NewRequest(s.req.Method, "http://"+dest+s.req.Path, bytes.NewReader(s.body))
		if err != nil {
			return nil, err
		}
		for k, v := range s.req.Header {
			req.Header.Set(k, v)
		}
		req.Header.Set(epp.HdrDestination, strings.Join(s.pick.Dest, ","))
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

func (s *gwStream) responsePhase(res *gwResult, resp *http.Response) error {
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
	a, err := s.c.Recv()
	if err != nil {
		return fmt.Errorf("response headers answer: %w", err)
	}
	if a.GetResponseHeaders() == nil {
		return fmt.Errorf("response headers answered with %T", a.Response)
	}
	if s.req.Mode.resp == filterv3.ProcessingMode_BUFFERED {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("read the replica: %w", err)
		}
		res.Upstream = b
		if err := s.c.Send(respBodyMsg(b, true, served)); err != nil {
			return fmt.Errorf("send the response body: %w", err)
		}
		a, err := s.c.Recv()
		if err != nil {
			return fmt.Errorf("response body answer: %w", err)
		}
		if a.GetResponseBody() == nil {
			return fmt.Errorf("response body answered with %T", a.Response)
		}
		res.Passed = applyBodyMutation(b, a.GetResponseBody().GetResponse())
		return nil
	}
	// Full duplex: each chunk the replica sends goes out as it comes; the
	// end of its body is an empty chunk with end_of_stream.
	go func() {
		buf := make([]byte, 16<<10)
		var err error
		for err == nil {
			n, rerr := resp.Body.Read(buf)
			if n > 0 {
				chunk := append([]byte(nil), buf[:n]...)
				res.Upstream = append(res.Upstream, chunk...)
				err = s.c.Send(respBodyMsg(chunk, false, served))
			}
			if rerr == io.EOF {
				err = s.c.Send(respBodyMsg(nil, true, served))
				break
			}
			if rerr != nil && err == nil {
				err = fmt.Errorf("read the replica: %w", rerr)
			}
		}
		s.sendEr <- err
	}()
	for {
		a, err := s.c.Recv()
		if err != nil {
			return fmt.Errorf("response body chunk: %w", err)
		}
		sr := a.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return fmt.Errorf("full duplex: a response body answer without a streamed_response: %v", a)
		}
		res.Passed = append(res.Passed, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	return <-s.sendEr
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

func bodyMsg(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func respBodyMsg(b []byte, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}},
		MetadataContext: md,
	}
}

// subsetMetadata is the subset hint as the protocol spells it: a list of
// ip:port under envoy.lb.subset_hint.
func subsetMetadata(addrs []string) *corev3.Metadata {
	l := make([]any, len(addrs))
	for i, a := range addrs {
		l[i] = a
	}
	v, err := structpb.NewList(l)
	if err != nil {
		panic(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		epp.NSSubset: {Fields: map[string]*structpb.Value{epp.MetaSubset: structpb.NewListValue(v)}},
	}}
}

// servedMetadata reports the endpoint that answered under envoy.lb.
func servedMetadata(addr string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		epp.NSDestination: {Fields: map[string]*structpb.Value{epp.MetaServed: structpb.NewStringValue(addr)}},
	}}
}

// ngfPick asks for a pick as NGINX Gateway Fabric's shim does: a new TLS
// connection (not verified) and stream per request; the request's headers
// lower-cased in value, no pseudo-headers and no protocol_config; the
// whole body in one message with end_of_stream; the send side closed; the
// pick read from a request_headers answer only, every answer read until
// the stream ends; no response phase.
func ngfPick(ctx context.Context, eppAddr string, hdr http.Header, body []byte) (dest string, refused int, err error) {
	conn, err := grpc.NewClient("passthrough:///"+eppAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		return "", 0, err
	}
	defer conn.Close()
	c, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("open the stream: %w", err)
	}
	hm := &corev3.HeaderMap{}
	for k, vs := range hdr {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), Value: v})
		}
	}
	if err := c.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
		return "", 0, fmt.Errorf("send the headers: %w", err)
	}
	if err := c.Send(bodyMsg(body, true)); err != nil {
		return "", 0, fmt.Errorf("send the body: %w", err)
	}
	if err := c.CloseSend(); err != nil {
		return "", 0, err
	}
	for {
		a, err := c.Recv()
		if err == io.EOF {
			return dest, 0, nil
		}
		if err != nil {
			return dest, 0, fmt.Errorf("receive: %w", err)
		}
		if ir := a.GetImmediateResponse(); ir != nil {
			return "", int(ir.GetStatus().GetCode()), nil
		}
		for _, h := range a.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == epp.HdrDestination {
				dest = string(h.GetHeader().GetRawValue())
			}
		}
	}
}
