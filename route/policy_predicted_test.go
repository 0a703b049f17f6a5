package route

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/policy"
)

func predictedServer(t *testing.T) (*Decider, *policy.PredictedTTFT) {
	t.Helper()
	s := mustServer(t, `
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: predicted-ttft, params: {block_bytes: 64}}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
          - {name: c, address: 127.0.0.1:8003}
`)
	t.Cleanup(s.Close)
	return s, s.Snapshot().Deployments[0].Serve.Policy.(*policy.PredictedTTFT)
}

// Issue 27: predicted-ttft sends a prompt where it is predicted to start
// soonest: to the replica holding its prefix while that one is not
// loaded, elsewhere once the queue there costs more than the prefill the
// hit saves; completions' TTFBs teach the model.
func TestPredictedTTFTRouting(t *testing.T) {
	s, pt := predictedServer(t)
	long := chatBody("llama", strings.Repeat("a long shared system prompt. ", 200), "q")
	first := do(s, long)
	home := hdr(first, contract.HdrServer)
	id, _ := contract.ParseDecisionID([]byte(hdr(first, contract.HdrDecision)))
	s.dec.CloseDecisionWith(id, Completion{Status: 200, Ms: 90, TTFB: 80, Retries: 0})
	if m := pt.PredictionErrorMedian(); math.IsNaN(m) {
		t.Fatal("the completion's TTFB was not learned from")
	}
	for i := range 5 {
		ctx := do(s, long)
		if got := hdr(ctx, contract.HdrServer); got != home {
			t.Fatalf("repeat %d went to %s, %s holds the prefix and nothing is loaded", i, got, home)
		}
		id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
		s.Ledger().Complete(id)
	}
	for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
		if e.Name == home {
			e.AddInflight(200) // far more queue than ~6 KiB of prefill costs
		}
	}
	if got := hdr(do(s, long), contract.HdrServer); got == home {
		t.Fatalf("routed to %s with 200 requests queued there", home)
	}
	var m strings.Builder
	s.WriteMetrics(&m)
	for _, want := range []string{`turnout_ttft_prediction_error_ratio_count{deployment="llama",pool="llama_mixed"} 1`, `turnout_ttft_model_coefficient{deployment="llama",pool="llama_mixed",endpoint="a",term="per_kib_ms"}`,
		`turnout_ttft_prediction_error_seconds_count{deployment="llama",pool="llama_mixed"} 1`, `turnout_ttft_prediction_error_median_seconds{deployment="llama",pool="llama_mixed"}`, `turnout_ttft_overrides_total{deployment="llama",pool="llama_mixed"}`} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// The prediction travels with the decision into the request log, beside
// the observed TTFB.
func TestPredictedTTFTInRequestLog(t *testing.T) {
	s, _ := predictedServer(t)
	sink := &captureSink{}
	s.Ledger().SetRequestSink(sink, 1)
	ctx := do(s, chatBody("llama", "sys", "hello"))
	id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
	s.dec.CloseDecisionWith(id, Completion{Status: 200, Ms: 40, TTFB: 30, Retries: 0})
	if len(sink.recs) != 1 || !predicted(&sink.recs[0]) || sink.recs[0].TTFBMs != 30 {
		t.Fatalf("request log records %+v: want one with a prediction and ttfb 30", sink.recs)
	}
	var line bytes.Buffer
	zl := zerolog.New(&line)
	sink.recs[0].Fields(zl.Log()).Send()
	if !regexp.MustCompile(`"state":"closed","predicted_ttft_ms":[0-9.e-]+,"start":`).Match(line.Bytes()) {
		t.Fatalf("log line %s: want predicted_ttft_ms between state and start", line.String())
	}
}

// predicted reports whether r carries a positive predicted TTFT.
func predicted(r *DecisionRecord) bool {
	v, ok := r.Notes.Get("predicted_ttft_ms")
	return ok && v > 0
}

type captureSink struct{ recs []DecisionRecord }

func (c *captureSink) Request(r *DecisionRecord) { c.recs = append(c.recs, *r) }

// Behind a proxy the feedback's TTFB is the headers' time, so once the
// engines report their time-to-first-token histogram the model learns
// from it instead: per scrape interval, the engine's mean TTFT against
// the mean features of the decisions sent in it.
func TestPredictedTTFTLearnsFromEngineTTFT(t *testing.T) {
	s, pt := predictedServer(t)
	eps := s.Snapshot().Deployments[0].Serve.Endpoints
	scrape := func(n uint64) {
		for _, e := range eps {
			e.SetEngineLoad(&fleet.EngineLoad{KVUsage: -1, TTFTCount: n, TTFTSeconds: float64(n) * 0.3, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
		}
	}
	route := func(k int) {
		for i := range k {
			ctx := do(s, chatBody("llama", "sys", fmt.Sprintf("question %d", i)))
			id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
			s.dec.CloseDecisionWith(id, Completion{Status: 200, Ms: 5, TTFB: 1, Retries: 0}) // header time
		}
	}
	scrape(0)
	route(12) // feedback learning: 12 lines of 1 ms
	if got := pt.Learnt(); got != 12 {
		t.Fatalf("learnt %d feedback lines before the engine reported, want 12", got)
	}
	scrape(10) // 10 first tokens at 300 ms each
	route(12)  // each endpoint's next decision learns its interval
	got := pt.Learnt()
	if got < 13 || got > 12+uint64(len(eps)) {
		t.Fatalf("learnt %d: want the 12 lines plus one interval per endpoint that had decisions, and no more feedback", got)
	}
	var m strings.Builder
	s.WriteMetrics(&m)
	if !strings.Contains(m.String(), `term="overhead_ms"`) {
		t.Fatal("no coefficients in the metrics")
	}
}
