package tracing_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
	"github.com/turnout/turnout/route/tracing"
)

// discard is an exporter that drops every batch: the benchmarks measure
// the decision's side (span, attributes, the batcher's queue), not the
// wire.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// benchDecide decides one prefix-affinity request per iteration through
// Decider.Decide (the SPOE agent's entry), with tracing as given; parent
// is the request's traceparent ("" none).
func benchDecide(b *testing.B, tracingYAML, parent string, on bool) {
	d := decider(&testing.T{}, tracingYAML)
	if on {
		log := zerolog.Nop()
		tr, err := tracing.New(&d.Snapshot().Config.Tracing, &log, tracing.Options{Exporter: discard{}})
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Shutdown(context.Background())
		d.Ledger().SetTracer(tr)
	}
	bodies := make([][]byte, 64)
	for i := range bodies {
		bodies[i] = []byte(routetest.Body4K(i))
	}
	var in contract.Input
	var v contract.Verdict
	ctName, ctValue, tpName, tpValue := []byte("content-type"), []byte("application/json"), []byte("traceparent"), []byte(parent)
	run := func(i int) {
		in.Reset()
		in.AddHeader(ctName, ctValue)
		if parent != "" {
			in.AddHeader(tpName, tpValue)
		}
		in.Body = bodies[i%len(bodies)]
		d.Decide(&in, &v)
		d.Ledger().Complete(v.Decision)
	}
	for i := range bodies {
		run(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		run(i)
	}
}

const tracingOn = "tracing: {endpoint: '127.0.0.1:4317'}\n"

func BenchmarkDecideTracingOff(b *testing.B) { benchDecide(b, "", traceparent("01"), false) }

// Sampled: every decision makes and exports a span.
func BenchmarkDecideTracingSampled(b *testing.B) { benchDecide(b, tracingOn, traceparent("01"), true) }

// Unsampled: the client's traceparent says not sampled; the sampler stops it.
func BenchmarkDecideTracingUnsampled(b *testing.B) {
	benchDecide(b, tracingOn, traceparent("00"), true)
}

// Root at a ratio of 0.01: no traceparent, one decision in a hundred traced.
func BenchmarkDecideTracingRatio1pc(b *testing.B) {
	benchDecide(b, "tracing: {endpoint: '127.0.0.1:4317', sample_ratio: 0.01}\n", "", true)
}
