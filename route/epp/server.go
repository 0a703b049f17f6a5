package epp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// Options configure a Server.
type Options struct {
	Log *zerolog.Logger
	// TLS is the listener's certificate (epp.tls); the zero value is
	// self-signed.
	TLS config.EPPTLSConfig
	// Server is epp.server: inline ("" too) or grpc.
	Server string
}

// Server is the Endpoint Picker: an ext_proc ExternalProcessor over a
// Decider, with the gRPC health services.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	d      *route.Decider
	log    zerolog.Logger
	creds  credentials.TransportCredentials
	tlsCfg *tls.Config
	grpc   bool // serve with grpc-go (epp.server: grpc)
	budget budget
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// New makes the Endpoint Picker of d; it fails when the TLS certificate
// cannot be made or read.
func New(d *route.Decider, o Options) (*Server, error) {
	s := &Server{d: d, log: zerolog.Nop(), grpc: o.Server == config.EPPServerGRPC}
	if o.Log != nil {
		s.log = o.Log.With().Str("component", "epp").Logger()
	}
	cfg, err := tlsConfig(o.TLS, &s.log)
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		s.tlsCfg, s.creds = cfg, credentials.NewTLS(cfg)
	}
	return s, nil
}

// maxRecvMsg bounds one message from the gateway: a BUFFERED body comes
// whole, up to the gateway's own buffer limit; max_body is at most 64 MiB.
const maxRecvMsg = 80 << 20

// The transport's flow control and goroutines. Static windows turn off
// grpc-go's BDP estimation, which pings the gateway on every burst of
// body data it reads; a request body up to streamWindow is read without a
// WINDOW_UPDATE, and the connection's updates come every connWindow/4
// bytes instead of every 16 KiB. Stream workers are goroutines kept for
// the streams (a new one per stream grows its stack anew each time);
// streams beyond them get their own goroutine, as without workers.
const (
	streamWindow  = 1 << 20
	connWindow    = 16 << 20
	streamWorkers = 64
)

// grpcServer is a gRPC server with turnout's options (creds nil: h2c).
func grpcServer(creds credentials.TransportCredentials) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecvMsg),
		// Gateways keep their ext_proc connections open and ping them.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.ForceServerCodecV2(codec{}),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return grpc.NewServer(opts...)
}

// Listener is a serving Endpoint Picker: the ext_proc listener (with the
// health services) and the optional plaintext health-only one.
type Listener struct {
	main, health *grpc.Server
	inline       *h2Server // epp.server: inline, instead of main
	ln           net.Listener
	hs           *health.Server
	stopTick     context.CancelFunc
	wg           sync.WaitGroup
}

// Serve serves the Endpoint Picker on ln, and the health services alone
// on healthLn when it is not nil, until Shutdown.
func (s *Server) Serve(ln, healthLn net.Listener) *Listener {
	l := &Listener{hs: health.NewServer(), ln: ln}
	if s.grpc {
		l.main = grpcServer(s.creds)
		extprocv3.RegisterExternalProcessorServer(l.main, s)
		healthpb.RegisterHealthServer(l.main, l.hs)
	} else {
		l.inline = newH2Server(s, l.hs, s.tlsCfg)
	}
	if healthLn != nil {
		l.health = grpcServer(nil)
		healthpb.RegisterHealthServer(l.health, l.hs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stopTick = cancel
	s.setHealth(l.hs)
	l.wg.Add(1)
	go func() { defer l.wg.Done(); s.followReadiness(ctx, l.hs) }()
	serve := func(g *grpc.Server, ln net.Listener, what string) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				s.log.Error().Err(err).Str("addr", ln.Addr().String()).Msg(what + " listener stopped")
			}
		}()
	}
	if l.inline != nil {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			if err := l.inline.serve(ln); err != nil {
				s.log.Error().Err(err).Str("addr", ln.Addr().String()).Msg("Endpoint Picker listener stopped")
			}
		}()
	} else {
		serve(l.main, ln, "Endpoint Picker")
	}
	if l.health != nil {
		serve(l.health, healthLn, "Endpoint Picker health")
	}
	return l
}

// Shutdown stops taking streams and waits for the open ones (a request's
// response phase lasts as long as its generation) until ctx ends, then
// cuts them.
func (l *Listener) Shutdown(ctx context.Context) {
	l.hs.Shutdown() // NOT_SERVING: gateways stop picking this instance
	l.stopTick()
	done := make(chan struct{})
	go func() {
		if l.inline != nil {
			l.inline.shutdown(ctx, l.ln)
		} else {
			l.main.GracefulStop()
		}
		if l.health != nil {
			l.health.GracefulStop()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		if l.main != nil {
			l.main.Stop()
		}
		if l.health != nil {
			l.health.Stop()
		}
		<-done
	}
	l.wg.Wait()
}

// Process serves one ext_proc stream: one HTTP request through the gateway.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	return s.process(srv)
}

// process is Process on either server's stream: its messages are decoded
// by hand (the codec's Unmarshal, decode.go).
func (s *Server) process(srv msgStream) (err error) {
	st := newStream(s, srv)
	defer st.finish()
	defer func() {
		// gRPC does not recover a handler's panic: one bad request must
		// not take every gateway's picks down.
		if p := recover(); p != nil {
			err = st.panicked(p)
		}
	}()
	req := &procReq{}
	for {
		rerr := srv.RecvMsg(req)
		if rerr != nil {
			if rerr == io.EOF || status.Code(rerr) == codes.Canceled || srv.Context().Err() != nil {
				return nil
			}
			return rerr
		}
		done, herr := st.handle(req)
		if herr != nil {
			return herr
		}
		if done {
			return nil
		}
	}
}

// panicked is the end of a stream whose handler panicked.
func (st *stream) panicked(p any) error {
	st.t = nil // its state is unknown: not pooled again
	st.s.log.Error().Interface("panic", p).Msg("Endpoint Picker stream panicked")
	return status.Errorf(codes.Internal, "turnout: internal error deciding the request")
}

// handle dispatches one message by its phase; done: the stream has its
// last answer (an ImmediateResponse). req is only read during the call,
// its bytes (which the Input views) until the decision.
func (st *stream) handle(req *procReq) (done bool, err error) {
	switch req.phase {
	case fReqRequestHeaders:
		return st.requestHeaders(req)
	case fReqRequestBody:
		return st.requestBody(req)
	case fReqRequestTrailers:
		return st.requestTrailers()
	case fReqResponseHeaders:
		return false, st.responseHeaders(req)
	case fReqResponseBody:
		return false, st.responseBody(req)
	case fReqResponseTrailers:
		return false, st.responseTrailers(req)
	default:
		return false, protocolError("a ProcessingRequest without a known phase (request_headers, request_body, request_trailers, response_headers, response_body, response_trailers)")
	}
}

// protocolError ends a stream the gateway got wrong, saying what was wrong.
func protocolError(what string) error {
	return status.Error(codes.InvalidArgument, "turnout Endpoint Picker: "+what)
}

// sendError ends a stream whose answer could not be sent.
func sendError(err error) error {
	return fmt.Errorf("send to the gateway: %w", err)
}
