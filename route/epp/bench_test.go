package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// BenchmarkEPPDecision is one decision through the Endpoint Picker as a
// gateway in FULL_DUPLEX_STREAMED mode makes it: one ext_proc stream per
// request over a loopback TCP gRPC connection (h2c), the headers, a ~4 KiB
// chat body with end_of_stream, the headers answer with the pick and the
// body passed back, then the stream closed. ns/op, cpu-ns/op and
// allocs/op count both sides (client and server run in this process);
// streams run in parallel, as a gateway's do.
func BenchmarkEPPDecision(b *testing.B) {
	for _, server := range []string{config.EPPServerInline, config.EPPServerGRPC} {
		b.Run(server, func(b *testing.B) { benchDecision(b, server) })
	}
}

func benchDecision(b *testing.B, server string) {
	cfg, err := config.ParseConfig([]byte(fleetYAML))
	if err != nil {
		b.Fatal(err)
	}
	d, err := route.New(cfg, route.Options{Seed: 42})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	s, err := New(d, Options{TLS: config.EPPTLSConfig{Mode: config.EPPTLSOff}, Server: server})
	if err != nil {
		b.Fatal(err)
	}
	benchStreams(b, func(ln net.Listener) func() {
		l := s.Serve(ln, nil)
		return func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l.Shutdown(ctx)
		}
	})
}

// BenchmarkEPPGRPCFloor is BenchmarkEPPDecision's exchange against a
// grpc-go server with the Endpoint Picker's options whose handler decides
// nothing (a fixed pick, the body echoed): what gRPC itself costs, below
// which the Endpoint Picker cannot go.
func BenchmarkEPPGRPCFloor(b *testing.B) {
	benchStreams(b, func(ln net.Listener) func() {
		g := grpcServer(nil)
		extprocv3.RegisterExternalProcessorServer(g, floorProcessor{})
		go func() { _ = g.Serve(ln) }()
		return g.Stop
	})
}

type floorProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (floorProcessor) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := srv.Recv()
		if err != nil {
			return nil
		}
		if body := req.GetRequestBody(); body != nil {
			hdr := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(HdrDestination, llamaAddrs[0])}}}}}}
			if err := srv.Send(hdr); err != nil {
				return err
			}
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body.GetBody(), EndOfStream: body.GetEndOfStream()}}}}}}}); err != nil {
				return err
			}
		}
	}
}

// benchStreams runs the gateway's streams against the server serve starts
// on a loopback listener (serve returns its stop).
func benchStreams(b *testing.B, serve func(net.Listener) func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	// The server's goroutines carry side=server (they inherit it from the
	// one serve starts): -tagfocus side=server profiles the server alone.
	var stop func()
	pprof.Do(context.Background(), pprof.Labels("side", "server"), func(context.Context) { stop = serve(ln) })
	defer stop()
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	c := extprocv3.NewExternalProcessorClient(conn)

	reqs := make([]benchRequest, 16)
	for i := range reqs {
		reqs[i] = newBenchRequest(i)
	}
	// One stream first: the connection is up before the clock starts.
	if err := benchDecide(c, &reqs[0]); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if err := benchDecide(c, &reqs[i%len(reqs)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	// ns/op is wall time, which a busy machine stretches; CPU time (both
	// sides) is what a decision costs.
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchRequest is one request's two messages, built once.
type benchRequest struct {
	headers, body *extprocv3.ProcessingRequest
	bodyLen       int
}

func newBenchRequest(i int) benchRequest {
	body := chat("llama", strings.Repeat(fmt.Sprintf("turn %d of a long conversation. ", i), 128))
	h := withMode(chatHeaders(false, "content-length", strconv.Itoa(len(body)), "x-session-id", "s"+strconv.Itoa(i)),
		filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	return benchRequest{headers: h, body: reqBody(body, true), bodyLen: len(body)}
}

// benchDecide runs one request's stream, failing unless the pick and the
// whole body came back.
func benchDecide(c extprocv3.ExternalProcessorClient, r *benchRequest) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.Process(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(r.headers); err != nil {
		return err
	}
	if err := s.Send(r.body); err != nil {
		return err
	}
	picked, got := false, 0
	for !picked || got < r.bodyLen {
		m, err := s.Recv()
		if err != nil {
			return fmt.Errorf("recv: %w", err)
		}
		switch x := m.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range x.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				picked = picked || (h.GetHeader().GetKey() == HdrDestination && len(h.GetHeader().GetRawValue()) > 0)
			}
			if !picked {
				return errors.New("headers answer without " + HdrDestination)
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			got += len(x.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
		default:
			return fmt.Errorf("unexpected answer %T", m.Response)
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("end of stream: %v", err)
	}
	return nil
}
