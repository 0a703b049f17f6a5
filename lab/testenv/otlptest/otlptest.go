// Package otlptest is an OTLP trace receiver for tests, over gRPC and
// HTTP (protobuf), built on the OTLP protocol's own Go types: it keeps
// every span it receives, with its resource's service.name.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// Span is one received span, with the ids in hex (as in a traceparent).
type Span struct {
	Service         string
	Name            string
	TraceID, SpanID string
	ParentSpanID    string
	TraceState      string
	Start, End      time.Time
	Attrs           map[string]any
	StatusCode      tracepb.Status_StatusCode
	Kind            tracepb.Span_SpanKind
}

// Receiver collects spans sent to it.
type Receiver struct {
	// Addr is host:port of the listener; GRPC tells which protocol it speaks.
	Addr string
	GRPC bool

	mu      sync.Mutex
	spans   []Span
	headers []map[string][]string
	coltracepb.UnimplementedTraceServiceServer
}

// StartHTTP serves OTLP/HTTP (POST /v1/traces, protobuf) on a loopback
// port until the test ends.
func StartHTTP(t testing.TB) *Receiver {
	t.Helper()
	ln := listen(t)
	r := &Receiver{Addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return r
}

// StartGRPC serves OTLP/gRPC (TraceService/Export) on a loopback port
// until the test ends.
func StartGRPC(t testing.TB) *Receiver {
	t.Helper()
	ln := listen(t)
	r := &Receiver{Addr: ln.Addr().String(), GRPC: true}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, r)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return r
}

func listen(t testing.TB) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: listen: %v", err)
	}
	return ln
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	b, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg, req.Header)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// Export is the gRPC TraceService's one call.
func (r *Receiver) Export(_ context.Context, msg *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.add(msg, nil)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(msg *coltracepb.ExportTraceServiceRequest, h http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h != nil {
		r.headers = append(r.headers, h.Clone())
	}
	for _, rs := range msg.GetResourceSpans() {
		svc := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				svc = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Service: svc, Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), TraceState: s.GetTraceState(),
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs: map[string]any{}, StatusCode: s.GetStatus().GetCode(), Kind: s.GetKind()}
				for _, kv := range s.GetAttributes() {
					sp.Attrs[kv.GetKey()] = value(kv.GetValue())
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

// value is an attribute's Go value: string, int64, float64 or bool.
func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	}
	return nil
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Headers returns the HTTP request headers of each OTLP/HTTP export.
func (r *Receiver) Headers() []map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string][]string(nil), r.headers...)
}

// WaitSpan waits up to d for a span of traceID (hex) and returns it.
func (r *Receiver) WaitSpan(t testing.TB, traceID string, d time.Duration) Span {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, s := range r.Spans() {
			if s.TraceID == traceID {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("otlptest: no span of trace %s within %v (got %d spans)", traceID, d, len(r.Spans()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
