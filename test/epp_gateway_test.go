//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/turnout/turnout/lab/bench"
	"github.com/turnout/turnout/route/epp"
)

// Gateways in front of turnout's Endpoint Picker, as the real ones drive
// the ext_proc stream: an Envoy-based one (bench.EnvoyGateway), which
// holds one gRPC connection, asks per request, proxies to the pick itself
// and reports the response back; and NGINX Gateway Fabric's shim
// (ngfPick), which dials per request and reads only the pick.

type (
	gwRequest = bench.GatewayRequest
	gwStream  = bench.GatewayStream
)

const (
	modeFullDuplex = bench.GatewayFullDuplex
	modeBuffered   = bench.GatewayBuffered
)

// eppDial is a gateway's connection to the Endpoint Picker: TLS against
// the self-signed certificate, not verified, as the reference setups do.
func eppDial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := bench.DialEPP(addr, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// envoyGateway is the shared Envoy-like gateway; its results carry the
// SSE events of the body that came back through ext_proc.
type envoyGateway struct{ *bench.EnvoyGateway }

func newEnvoyGateway(t testing.TB, eppAddr string) *envoyGateway {
	tr := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &envoyGateway{bench.NewEnvoyGateway(eppDial(t, eppAddr), &http.Client{Transport: tr, Timeout: 30 * time.Second})}
}

// gwResult is a request's outcome downstream with the events it carried.
type gwResult struct {
	*bench.GatewayResult
	Events chatEvents
}

// Do runs a request through and reads the passed-back events.
func (g *envoyGateway) Do(ctx context.Context, r gwRequest) (*gwResult, error) {
	return withEvents(g.EnvoyGateway.Do(ctx, r))
}

// withEvents reads the SSE events of a finished request's passed-back body.
func withEvents(res *bench.GatewayResult, err error) (*gwResult, error) {
	out := &gwResult{GatewayResult: res}
	if err != nil || res == nil {
		return out, err
	}
	out.Events, err = readChatEvents(bytes.NewReader(res.Passed))
	return out, err
}

// chatRequest is a streamed chat completion of user's text.
func chatRequest(user string, hdr ...string) gwRequest {
	b, _ := json.Marshal(map[string]any{
		"model": "llama", "stream": true, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": user}},
	})
	h := http.Header{"Content-Type": {"application/json"}}
	for i := 0; i+1 < len(hdr); i += 2 {
		h.Set(hdr[i], hdr[i+1])
	}
	return gwRequest{Header: h, Body: b, Mode: modeFullDuplex}
}

// ngfPick asks for a pick as NGINX Gateway Fabric's shim does: a new TLS
// connection (not verified) and stream per request; the request's headers
// lower-cased in value, no pseudo-headers and no protocol_config; the
// whole body in one message with end_of_stream; the send side closed; the
// pick read from a request_headers answer only, every answer read until
// the stream ends; no response phase.
func ngfPick(ctx context.Context, eppAddr string, hdr http.Header, body []byte) (dest string, refused int, err error) {
	conn, err := bench.DialEPP(eppAddr, true)
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
	if err := c.Send(bench.RequestBodyMessage(body, true)); err != nil {
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
