package tracing_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/otlptest"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
	"github.com/turnout/turnout/route/tracing"
)

const (
	traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID = "00f067aa0ba902b7"
)

func traceparent(flags string) string { return "00-" + traceID + "-" + parentID + "-" + flags }

// decider is a four-endpoint prefix-affinity Decider with tracing as given.
func decider(t *testing.T, tracingYAML string) *route.Decider {
	t.Helper()
	d, err := route.New(routetest.MustConfig(t, tracingYAML+fmt.Sprintf(routetest.FourEndpoints, "prefix-affinity")), route.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// decide routes one request with the given trace context headers.
func decide(d *route.Decider, body, parent, state string) *contract.Verdict {
	var in contract.Input
	in.AddHeader([]byte("content-type"), []byte("application/json"))
	if parent != "" {
		in.AddHeader([]byte("traceparent"), []byte(parent))
	}
	if state != "" {
		in.AddHeader([]byte("tracestate"), []byte(state))
	}
	in.Body = []byte(body)
	var v contract.Verdict
	d.Decide(&in, &v)
	return &v
}

// inMemory is a Tracer exporting to memory, for tracingYAML's sampling.
func inMemory(t *testing.T, cfg *config.Config) (*tracing.Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	log := zerolog.Nop()
	tr, err := tracing.New(&cfg.Tracing, &log, tracing.Options{Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	return tr, exp
}

func flush(t *testing.T, tr *tracing.Tracer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
}

// A decision's span: a child of the client's traceparent (its trace id
// and parent span id, its tracestate), timed from arrival to verdict, with
// the decision's attributes; a refusal's span has its status and reason.
func TestDecisionSpan(t *testing.T) {
	d := decider(t, "tracing: {endpoint: '127.0.0.1:4317'}\n")
	tr, exp := inMemory(t, d.Snapshot().Config)
	d.Ledger().SetTracer(tr)
	decide(d, routetest.Body4K(1), traceparent("01"), "vendor=a")
	v := decide(d, routetest.Body4K(1), traceparent("01"), "vendor=a") // a prefix hit
	decide(d, `{"model":"nope","prompt":"x"}`, traceparent("01"), "")
	flush(t, tr)
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	s := spans[1]
	if s.Name != tracing.SpanName || s.SpanContext.TraceID().String() != traceID || s.Parent.SpanID().String() != parentID ||
		!s.Parent.IsRemote() || s.SpanContext.TraceState().String() != "vendor=a" || s.SpanKind != trace.SpanKindServer {
		t.Errorf("span %s trace %s parent %s remote %v state %q", s.Name, s.SpanContext.TraceID(), s.Parent.SpanID(), s.Parent.IsRemote(), s.SpanContext.TraceState())
	}
	if s.EndTime.Before(s.StartTime) || time.Since(s.StartTime) > time.Minute {
		t.Errorf("times %v .. %v", s.StartTime, s.EndTime)
	}
	attrs := map[string]string{}
	for _, a := range s.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	want := map[string]string{
		tracing.AttrDeployment: "llama", tracing.AttrPool: "llama_mixed", tracing.AttrPolicy: "prefix-affinity",
		tracing.AttrOutcome: "affinity", tracing.AttrEndpoint: string(v.Server), tracing.AttrAddress: string(v.Addr),
		tracing.AttrStatus: "200", tracing.AttrModel: "llama", tracing.AttrDecision: string(v.DecisionHex()),
	}
	for k, w := range want {
		if attrs[k] != w {
			t.Errorf("%s = %q, want %q", k, attrs[k], w)
		}
	}
	if attrs[tracing.AttrMatched] == "" || attrs[tracing.AttrMatched] == "0" {
		t.Errorf("matched blocks %q on a prefix hit", attrs[tracing.AttrMatched])
	}
	ref := spans[2]
	attrs = map[string]string{}
	for _, a := range ref.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs[tracing.AttrStatus] != "404" || attrs[tracing.AttrReason] != "model_not_found" || attrs[tracing.AttrEndpoint] != "" {
		t.Errorf("refusal attributes %v", attrs)
	}
}

// Sampling: a client's traceparent decides by its sampled flag, whatever
// the ratio; without one, sample_ratio decides (0: none, 1: all).
func TestSampling(t *testing.T) {
	for _, tc := range []struct {
		ratio  string
		parent string
		want   int
	}{
		{"0", "", 0},
		{"1", "", 1},
		{"0", traceparent("01"), 1},
		{"1", traceparent("00"), 0},
		{"1", "not-a-traceparent", 1}, // unreadable: a new trace, sampled at the ratio
	} {
		d := decider(t, "tracing: {endpoint: '127.0.0.1:4317', sample_ratio: "+tc.ratio+"}\n")
		tr, exp := inMemory(t, d.Snapshot().Config)
		d.Ledger().SetTracer(tr)
		decide(d, routetest.Body4K(1), tc.parent, "")
		flush(t, tr)
		if n := len(exp.GetSpans()); n != tc.want {
			t.Errorf("ratio %s parent %q: %d spans, want %d", tc.ratio, tc.parent, n, tc.want)
		}
	}
}

// The ratio samples about its fraction of root traces, by trace id.
func TestSamplingRatio(t *testing.T) {
	s := tracing.Sampler(0.25)
	r := rand.New(rand.NewPCG(1, 2))
	const n = 20000
	sampled := 0
	for range n {
		var id trace.TraceID
		binary.BigEndian.PutUint64(id[:8], r.Uint64())
		binary.BigEndian.PutUint64(id[8:], r.Uint64())
		res := s.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: id, Name: tracing.SpanName})
		if res.Decision == sdktrace.RecordAndSample {
			sampled++
		}
	}
	if f := float64(sampled) / n; f < 0.23 || f > 0.27 {
		t.Errorf("sampled %.3f of root traces at ratio 0.25", f)
	}
}

// The OTLP exporters reach a real receiver: gRPC and HTTP, the client's
// trace id and parent on the wire, the configured headers and service name.
func TestOTLPExport(t *testing.T) {
	for _, proto := range []string{"grpc", "http"} {
		t.Run(proto, func(t *testing.T) {
			var rcv *otlptest.Receiver
			if proto == "grpc" {
				rcv = otlptest.StartGRPC(t)
			} else {
				rcv = otlptest.StartHTTP(t)
			}
			d := decider(t, fmt.Sprintf("tracing: {endpoint: %q, protocol: %s, insecure: true, service_name: edge-a, headers: {x-otlp-key: k1}}\n", rcv.Addr, proto))
			log := zerolog.Nop()
			tr, err := tracing.New(&d.Snapshot().Config.Tracing, &log, tracing.Options{BatchTimeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Shutdown(context.Background()) })
			d.Ledger().SetTracer(tr)
			v := decide(d, routetest.Body4K(1), traceparent("01"), "")
			s := rcv.WaitSpan(t, traceID, 30*time.Second)
			if s.ParentSpanID != parentID || s.Service != "edge-a" || s.Name != tracing.SpanName ||
				s.Attrs[tracing.AttrEndpoint] != string(v.Server) || s.Attrs[tracing.AttrDeployment] != "llama" || s.Attrs[tracing.AttrStatus] != int64(200) {
				t.Errorf("received %+v", s)
			}
			var c tracing.Counts
			tr.Counts(&c)
			if c.Exported != 1 || c.Failed != 0 {
				t.Errorf("counts %+v, want 1 exported", c)
			}
			if proto == "http" {
				if h := rcv.Headers(); len(h) == 0 || h[0]["X-Otlp-Key"][0] != "k1" {
					t.Errorf("export headers %v", h)
				}
			}
		})
	}
}

// An unreachable receiver costs counted, dropped spans, never a decision.
func TestOTLPExportFailureCounted(t *testing.T) {
	d := decider(t, "tracing: {endpoint: '127.0.0.1:1', protocol: http, insecure: true}\n")
	log := zerolog.Nop()
	tr, err := tracing.New(&d.Snapshot().Config.Tracing, &log, tracing.Options{BatchTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	d.Ledger().SetTracer(tr)
	if v := decide(d, routetest.Body4K(1), traceparent("01"), ""); v.Status != 200 {
		t.Fatalf("status %d", v.Status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr.Shutdown(ctx)
	var c tracing.Counts
	tr.Counts(&c)
	if c.Failed != 1 || c.Exported != 0 {
		t.Errorf("counts %+v, want 1 failed", c)
	}
}
