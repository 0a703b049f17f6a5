package route

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/estimator"
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
// hit saves; completions' first-token times teach the model.
func TestPredictedTTFTRouting(t *testing.T) {
	s, pt := predictedServer(t)
	long := chatBody("llama", strings.Repeat("a long shared system prompt. ", 200), "q")
	first := do(s, long)
	home := hdr(first, contract.HdrServer)
	id, _ := contract.ParseDecisionID([]byte(hdr(first, contract.HdrDecision)))
	s.dec.CloseDecisionWith(id, Completion{Status: 200, Ms: 90, TTFB: 2, Retries: 0, FirstTokenMs: 80, HasFirstToken: true})
	if m := pt.PredictionErrors().Rel[estimator.FirstToken].Median(); math.IsNaN(m) {
		t.Fatal("the completion's first-token time was not learned from")
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
	for _, want := range []string{`turnout_ttft_prediction_error_ratio_count{deployment="llama",pool="llama_mixed",source="first_token"} 1`, `turnout_ttft_model_coefficient{deployment="llama",pool="llama_mixed",endpoint="a",term="per_kib_ms"}`,
		`turnout_ttft_prediction_error_seconds_count{deployment="llama",pool="llama_mixed",source="first_token"} 1`, `turnout_ttft_prediction_error_seconds_count{deployment="llama",pool="llama_mixed",source="engine"} 0`, `turnout_ttft_overrides_total{deployment="llama",pool="llama_mixed"}`} {
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

// Behind a proxy the feedback's TTFB is the headers' time, which vLLM
// sends before a stream's first token: completions without a first-token
// time teach nothing; the engines' time-to-first-token histograms teach
// (per scrape interval, the engine's mean TTFT against the mean features
// of the decisions sent in it) until first-token times come, which then
// teach at exactly their value.
func TestPredictedTTFTLearnsFromFirstTokens(t *testing.T) {
	s, pt := predictedServer(t)
	eps := s.Snapshot().Deployments[0].Serve.Endpoints
	var scraped uint64
	scrape := func(n uint64) {
		scraped += n
		for _, e := range eps {
			e.SetEngineLoad(&fleet.EngineLoad{KVUsage: -1, TTFTCount: scraped, TTFTSeconds: float64(scraped) * 0.3, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
		}
	}
	route := func(k int, c Completion) {
		for i := range k {
			ctx := do(s, chatBody("llama", "sys", fmt.Sprintf("question %d", i)))
			id, _ := contract.ParseDecisionID([]byte(hdr(ctx, contract.HdrDecision)))
			s.dec.CloseDecisionWith(id, c)
		}
	}
	header := Completion{Status: 200, Ms: 5, TTFB: 1, Retries: 0}
	scrape(0)
	route(12, header)
	if got := pt.Learnt(); got != 0 {
		t.Fatalf("learnt %d times from completions without a first-token time, want 0", got)
	}
	scrape(10) // 10 first tokens at 300 ms each
	route(12, header)
	errs := pt.PredictionErrors()
	got := errs.Count(estimator.EngineMean)
	if got < 1 || got > uint64(len(eps)) || pt.Learnt() != got {
		t.Fatalf("learnt %d (engine intervals %d): want one interval per endpoint that had decisions, nothing from headers", pt.Learnt(), got)
	}
	// First tokens at 400 ms: the model follows them, the engine (300 ms)
	// no longer teaches the endpoints that report them.
	withTFT := header
	withTFT.FirstTokenMs, withTFT.HasFirstToken = 400, true
	for range 40 {
		scrape(10)
		route(3, withTFT)
	}
	if n := errs.Count(estimator.FirstToken); n != 120 {
		t.Fatalf("%d first-token times learned, want 120", n)
	}
	// Each endpoint's interval before its first fed-back first token
	// still teaches; none after.
	if n := errs.Count(estimator.EngineMean); n > got+uint64(len(eps)) {
		t.Fatalf("engine intervals learned went %d -> %d while first tokens were fed back (at most one more per endpoint)", got, n)
	}
	got = errs.Count(estimator.EngineMean)
	x := estimator.Make(0, 0, 16)
	for _, e := range eps {
		pred := policyModelPredict(pt, e, &x)
		if math.Abs(pred-400) > 40 {
			t.Errorf("%s predicts %.0f ms at light load; the first tokens said 400 (headers 1, engine 300)", e.Name, pred)
		}
	}
	var m strings.Builder
	s.WriteMetrics(&m)
	for _, want := range []string{
		"# TYPE turnout_ttft_prediction_error_seconds histogram",
		`turnout_ttft_prediction_error_seconds_count{deployment="llama",pool="llama_mixed",source="first_token"} 120`,
		fmt.Sprintf(`turnout_ttft_prediction_error_ratio_count{deployment="llama",pool="llama_mixed",source="engine"} %d`, got),
		`term="overhead_ms"`,
	} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	var r strings.Builder
	s.WriteReadiness(&r, true)
	line := regexp.MustCompile(`(?m)^ttft prediction deployment llama pool llama_mixed: first_token 120 samples, median error ([0-9]+) ms, ([0-9.]+) relative; engine ([0-9]+) samples.*$`).FindStringSubmatch(r.String())
	if line == nil {
		t.Fatalf("/readyz?verbose lacks the prediction line:\n%s", r.String())
	}
	if line[3] != fmt.Sprint(got) {
		t.Fatalf("readyz engine samples %s, want %d", line[3], got)
	}
	// The first predictions were the prior's (~20-200 ms) against 400 ms,
	// so the median error is not 0, and the model then learned.
	if abs, _ := strconv.Atoi(line[1]); abs <= 0 || abs > 400 {
		t.Fatalf("readyz median error %s ms: want in (0, 400]", line[1])
	}
}

// policyModelPredict is e's model's prediction for x.
func policyModelPredict(pt *policy.PredictedTTFT, e *fleet.Endpoint, x *estimator.Features) float64 {
	c := pt.ModelCoef(e.Index)
	var y float64
	for i := range x {
		y += c[i] * x[i]
	}
	return y
}
