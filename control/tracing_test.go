package control

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/otlptest"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// The tracer follows the applied config: on, a decision's span reaches
// the receiver; off again, decisions are not traced and /metrics keeps
// the replaced tracer's count.
func TestTracersFollowConfig(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	base := "health: {disable: true}\ndeployments:\n  - name: a\n    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]\n"
	parse := func(y string) *config.Config {
		c, err := config.ParseConfig([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	on := parse(fmt.Sprintf("tracing: {endpoint: %q, protocol: http, insecure: true}\n", rcv.Addr) + base)
	srv, err := route.New(parse(base), route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	log := zerolog.Nop()
	tr := &tracers{log: &log, core: newCore(srv)}
	decide := func(traceID string) {
		var in contract.Input
		in.AddHeader([]byte("traceparent"), []byte("00-"+traceID+"-00f067aa0ba902b7-01"))
		in.Body = []byte(`{"model":"a","prompt":"x"}`)
		var v contract.Verdict
		srv.Decide(&in, &v)
		if v.Status != 200 {
			t.Fatalf("status %d %s", v.Status, v.Body)
		}
	}
	tr.apply(on)
	if tr.cur == nil {
		t.Fatal("tracing on, no tracer")
	}
	decide("11111111111111111111111111111111")
	tr.apply(on) // unchanged: the same tracer
	first := tr.cur
	tr.apply(parse(base))
	if tr.cur != nil {
		t.Fatal("tracing off, a tracer is kept")
	}
	rcv.WaitSpan(t, "11111111111111111111111111111111", 30*time.Second) // flushed by the retired tracer
	decide("22222222222222222222222222222222")
	if first == nil {
		t.Fatal("no first tracer")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var b strings.Builder
		tr.writeMetrics(&b)
		if strings.Contains(b.String(), `turnout_tracing_spans_total{result="exported"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n%s", b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr.close()
	for _, s := range rcv.Spans() {
		if s.TraceID == "22222222222222222222222222222222" {
			t.Errorf("a decision after tracing went off was traced")
		}
	}
}
