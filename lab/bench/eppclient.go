package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/turnout/turnout/lab/mock"
)

// The gateway side of the Endpoint Picker Protocol, as Envoy's ext_proc
// filter drives it in FULL_DUPLEX_STREAMED mode: one stream per request,
// the request headers (with the protocol config on the first message),
// the body, then the answers read: the headers answer with the pick and
// the body passed back. No response phase: like the /internal/route and
// SPOE clients, the decision is the whole of the work.

// destinationHeader is the header the pick comes back in (GIE protocol).
const destinationHeader = "x-gateway-destination-endpoint"

// envoyWindow is Envoy's default HTTP/2 stream and connection window.
const envoyWindow = 256 << 20

// DialEPP opens a gRPC connection to an Endpoint Picker; with useTLS the
// certificate is not verified, as gateways do with the reference EPP's.
func DialEPP(addr string, useTLS bool) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the EPP's certificate is self-signed, as gateways accept it
	}
	// Envoy's HTTP/2 windows (256 MiB by default) and no BDP pings: grpc-go's
	// dynamic window would ping the Endpoint Picker on every read burst,
	// which Envoy does not.
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(envoyWindow), grpc.WithInitialConnWindowSize(envoyWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("epp dial %s: %w", addr, err)
	}
	return cc, nil
}

// eppRequest is one request's messages, built once per body.
type eppRequest struct {
	headers, body *extprocv3.ProcessingRequest
}

func newEPPRequest(b *CostBody) eppRequest {
	hv := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	hdrs := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			hv(":method", "POST"), hv(":path", mock.PathChat), hv(":authority", "gateway.bench"), hv(":scheme", "http"),
			hv("content-type", "application/json"), hv("content-length", fmt.Sprint(len(b.Body))), hv("x-session-id", b.Session),
		}}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b.Body, EndOfStream: true}}}
	return eppRequest{headers: hdrs, body: body}
}

// eppDecide runs one request's stream: it returns the picked endpoint, or
// an error for a refusal, a protocol break or a missing pick.
func eppDecide(ctx context.Context, c extprocv3.ExternalProcessorClient, r eppRequest, bodyLen int) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Process(ctx)
	if err != nil {
		return "", err
	}
	if err := s.Send(r.headers); err != nil {
		return "", err
	}
	if err := s.Send(r.body); err != nil {
		return "", err
	}
	var picked string
	got := 0
	for got < bodyLen || picked == "" {
		m, err := s.Recv()
		if err != nil {
			return "", fmt.Errorf("recv: %w", err)
		}
		switch x := m.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range x.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == destinationHeader {
					picked = string(h.GetHeader().GetRawValue())
				}
			}
			if picked == "" {
				return "", errors.New("headers answer without " + destinationHeader)
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			sb := x.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sb == nil {
				return "", errors.New("body answer without a streamed body")
			}
			got += len(sb.GetBody())
			if sb.GetEndOfStream() && got < bodyLen {
				return "", fmt.Errorf("body passed back: %d of %d bytes", got, bodyLen)
			}
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			return "", fmt.Errorf("refused: %d %s", x.ImmediateResponse.GetStatus().GetCode(), x.ImmediateResponse.GetBody())
		default:
			return "", fmt.Errorf("unexpected answer %T", m.Response)
		}
	}
	if err := s.CloseSend(); err != nil {
		return "", err
	}
	if _, err := s.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("end of stream: %w", err)
	}
	primary, _, _ := strings.Cut(picked, ",")
	return primary, nil
}
