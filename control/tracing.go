package control

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/tracing"
)

// tracers keeps the decision tracer (tracing) in line with the applied
// config: rebuilt only when its section changes, the old one flushed after
// the Decider moved to the new one.
type tracers struct {
	log  *zerolog.Logger
	core core

	mu  sync.Mutex
	key config.TracingConfig
	cur *tracing.Tracer
	// done are the counts of the tracers replaced (added once flushed),
	// so /metrics counts on.
	done tracing.Counts
}

// tracerFlush bounds how long a replaced or stopped tracer flushes.
const tracerFlush = 5 * time.Second

// apply is an OnApply hook: the config was accepted, so an exporter that
// cannot be built is logged and the previous tracer kept.
func (t *tracers) apply(c *config.Config) {
	t.mu.Lock()
	defer t.mu.Unlock()
	want := c.Tracing
	if want.Equal(&t.key) && (t.cur != nil) == want.On() {
		return
	}
	var next *tracing.Tracer
	if want.On() {
		tr, err := t.core.newTracer(&want, t.log)
		if err != nil {
			t.log.Error().Err(err).Msg("tracing not started; keeping the previous tracer")
			return
		}
		next = tr
		t.log.Info().Str("endpoint", want.Endpoint).Str("protocol", want.Protocol).Float64("sample_ratio", want.Ratio()).Msg("tracing on")
	} else if t.cur != nil {
		t.log.Info().Msg("tracing off")
	}
	t.core.setTracer(next)
	t.retire()
	t.cur, t.key = next, want
}

// retire flushes the current tracer in the background (its spans are
// already out of the decisions' way); under mu.
func (t *tracers) retire() {
	old := t.cur
	if old == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracerFlush)
		defer cancel()
		if err := old.Shutdown(ctx); err != nil {
			t.log.Warn().Err(err).Msg("tracing: flush of the replaced tracer")
		}
		// Counted once flushed: its last batches are exported by Shutdown.
		var c tracing.Counts
		old.Counts(&c)
		t.mu.Lock()
		t.done.Exported += c.Exported
		t.done.Failed += c.Failed
		t.mu.Unlock()
	}()
}

// close flushes the tracer at shutdown.
func (t *tracers) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.core.setTracer(nil)
	if t.cur == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracerFlush)
	defer cancel()
	if err := t.cur.Shutdown(ctx); err != nil {
		t.log.Warn().Err(err).Msg("tracing: flush at shutdown")
	}
	t.cur = nil
}

// writeMetrics writes the span export counters, 0 while tracing is off.
func (t *tracers) writeMetrics(b *strings.Builder) {
	t.mu.Lock()
	c := t.done
	if t.cur != nil {
		var n tracing.Counts
		t.cur.Counts(&n)
		c.Exported += n.Exported
		c.Failed += n.Failed
	}
	t.mu.Unlock()
	b.WriteString("# HELP turnout_tracing_spans_total Decision spans handed to the OTLP exporter, by result (failed: the receiver refused them or was unreachable).\n")
	b.WriteString("# TYPE turnout_tracing_spans_total counter\n")
	fmt.Fprintf(b, "turnout_tracing_spans_total{result=\"exported\"} %d\n", c.Exported)
	fmt.Fprintf(b, "turnout_tracing_spans_total{result=\"failed\"} %d\n", c.Failed)
}
