package tracing

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// SpanName names every decision span.
const SpanName = "turnout.decide"

// Tracer turns decisions into spans and exports them.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TraceContext
	exp    *countingExporter
}

var _ route.Tracer = (*Tracer)(nil)

// Options tune a Tracer beyond its config (tests).
type Options struct {
	// Exporter replaces the OTLP exporter the config describes.
	Exporter sdktrace.SpanExporter
	// BatchTimeout is the longest a span waits for its batch (0: the
	// SDK's default, 5s).
	BatchTimeout time.Duration
}

// New builds a Tracer for cfg (tracing on). The exporter connects lazily:
// an unreachable receiver costs dropped spans and log lines, not an error.
func New(cfg *config.TracingConfig, log *zerolog.Logger, opts Options) (*Tracer, error) {
	exp := opts.Exporter
	if exp == nil {
		var err error
		if exp, err = newExporter(cfg); err != nil {
			return nil, err
		}
	}
	ce := &countingExporter{next: exp, log: log}
	bopts := []sdktrace.BatchSpanProcessorOption{}
	if opts.BatchTimeout > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(opts.BatchTimeout))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(ce, bopts...),
		sdktrace.WithSampler(Sampler(cfg.Ratio())),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName))),
	)
	return &Tracer{tp: tp, tracer: tp.Tracer("github.com/turnout/turnout/route/tracing"), exp: ce}, nil
}

// Sampler is the sampling of decisions: a client's traceparent decides by
// its sampled flag (the whole trace is kept or not); a decision without
// one starts a trace with probability ratio, by trace id.
func Sampler(ratio float64) sdktrace.Sampler {
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))
}

// newExporter is the OTLP exporter of cfg.
func newExporter(cfg *config.TracingConfig) (sdktrace.SpanExporter, error) {
	ctx := context.Background()
	switch cfg.Protocol {
	case config.TracingHTTP:
		return otlptracehttp.New(ctx, otlpOptions(cfg, otlptracehttp.WithHeaders,
			otlptracehttp.WithEndpointURL, otlptracehttp.WithEndpoint, otlptracehttp.WithInsecure)...)
	case config.TracingGRPC:
		return otlptracegrpc.New(ctx, otlpOptions(cfg, otlptracegrpc.WithHeaders,
			otlptracegrpc.WithEndpointURL, otlptracegrpc.WithEndpoint, otlptracegrpc.WithInsecure)...)
	}
	return nil, fmt.Errorf("tracing: protocol %q is not grpc or http", cfg.Protocol)
}

// Decided makes the decision's span: started at the request's arrival,
// ended at its verdict, a child of the client's traceparent. An unsampled
// decision stops at the sampler.
func (t *Tracer) Decided(s *route.DecisionSpan) {
	if unsampledParent(s.Traceparent) {
		return // what the sampler would say, without parsing into a context
	}
	ctx := context.Background()
	if len(s.Traceparent) > 0 {
		ctx = t.prop.Extract(ctx, carrier{parent: string(s.Traceparent), state: string(s.Tracestate)})
	}
	_, span := t.tracer.Start(ctx, SpanName, trace.WithTimestamp(s.Arrival), trace.WithSpanKind(trace.SpanKindServer))
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(Attributes(s)...)
	if v := s.Verdict; v.Status >= 500 {
		span.SetStatus(codes.Error, v.Reason)
	}
	span.End(trace.WithTimestamp(s.End))
}

// otlpOptions are cfg's headers, endpoint (a URL, or host:port with
// Insecure) in one OTLP client's option type O.
func otlpOptions[O any](cfg *config.TracingConfig, headers func(map[string]string) O, url, endpoint func(string) O, insecure func() O) []O {
	o := []O{headers(cfg.Headers)}
	if cfg.IsURL() {
		return append(o, url(cfg.Endpoint))
	}
	o = append(o, endpoint(cfg.Endpoint))
	if cfg.Insecure {
		o = append(o, insecure())
	}
	return o
}

// unsampledParent reports whether tp is a version-00 traceparent whose
// sampled flag is clear: the parent-based sampler drops such a decision.
func unsampledParent(tp []byte) bool {
	const n = len("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
	if len(tp) != n || tp[0] != '0' || tp[1] != '0' || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' {
		return false
	}
	f := tp[54]
	switch {
	case f >= '0' && f <= '9':
		f -= '0'
	case f >= 'a' && f <= 'f':
		f -= 'a' - 10
	default:
		return false
	}
	return f&1 == 0 && isHex(tp[53])
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// Shutdown flushes the spans still queued (until ctx ends) and stops the
// exporter.
func (t *Tracer) Shutdown(ctx context.Context) error { return t.tp.Shutdown(ctx) }

// ForceFlush exports the spans still queued (until ctx ends).
func (t *Tracer) ForceFlush(ctx context.Context) error { return t.tp.ForceFlush(ctx) }

// Counts reads the export counters.
func (t *Tracer) Counts(b *Counts) { t.exp.counts(b) }

// carrier reads the two trace context headers of one request.
type carrier struct{ parent, state string }

var _ propagation.TextMapCarrier = carrier{}

func (c carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.parent
	case "tracestate":
		return c.state
	}
	return ""
}

func (c carrier) Set(string, string) {}

func (c carrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// Counts are the spans handed to the exporter, by result.
type Counts struct {
	Exported, Failed uint64
}

// countingExporter counts what the batcher exports and logs failures
// (the first, then at most one a minute) on turnout's logger.
type countingExporter struct {
	next             sdktrace.SpanExporter
	log              *zerolog.Logger
	exported, failed atomic.Uint64
	lastLog          atomic.Int64
}

var _ sdktrace.SpanExporter = (*countingExporter)(nil)

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.next.ExportSpans(ctx, spans)
	if err == nil {
		e.exported.Add(uint64(len(spans)))
		return nil
	}
	e.failed.Add(uint64(len(spans)))
	now := time.Now().UnixNano()
	if last := e.lastLog.Load(); (last == 0 || now-last >= int64(time.Minute)) && e.lastLog.CompareAndSwap(last, now) {
		e.log.Warn().Err(err).Int("spans", len(spans)).Msg("tracing: export failed; spans dropped")
	}
	// Logged here: the SDK would print it again on its global handler.
	return nil
}

func (e *countingExporter) Shutdown(ctx context.Context) error { return e.next.Shutdown(ctx) }

func (e *countingExporter) counts(b *Counts) {
	b.Exported, b.Failed = e.exported.Load(), e.failed.Load()
}
