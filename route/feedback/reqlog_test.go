package feedback

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// recSink keeps the request log's records.
type recSink struct {
	mu   sync.Mutex
	recs []route.DecisionRecord
}

func (s *recSink) Request(r *route.DecisionRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, *r)
}

// TestRequestLogRecords: a routed request closed by a feedback line whose
// srv is the fallback (a retry redispatched) gives one record with the
// decision's fields and the line's figures; the lookup finds the same
// decision closed; a refusal gives a record with its reason and status.
func TestRequestLogRecords(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", `"127.0.0.1"`, "s3cret-token-0123456789"))
	var sink recSink
	s.Ledger().SetRequestSink(&sink, 1)

	ctx := routeCtx(chatBody("llama", "sys", "hi"), "user-7")
	ctx.Request.Header.Set(contract.HdrOriginalURI, "/v1/chat/completions?api_key=secret")
	ctx.Request.Header.Set("X-Request-Id", "req-42")
	s.api.Handler(ctx)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("route: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	id, srv := hdr(ctx, contract.HdrDecision), hdr(ctx, contract.HdrServer)
	other := map[string]string{"a": "b", "b": "a"}[srv]
	var dec uint64
	fmt.Sscanf(id, "%x", &dec)
	var open route.DecisionRecord
	if !s.Ledger().LookupDecision(dec, time.Now(), &open) || open.State != "open" || open.Endpoint != srv {
		t.Fatalf("lookup of the open decision: %+v", open)
	}
	if string(open.Request.RequestID()) != "req-42" || string(open.Request.Path()) != "/v1/chat/completions" {
		t.Errorf("open decision: request id %q path %q", open.Request.RequestID(), open.Request.Path())
	}
	line := fmt.Sprintf("turnout-done id=%s srv=%s status=200 ms=1234 ttfb=56 tft=789 tok=s3cret-token-0123456789 retries=+1 term=CD", id, other)
	s.Datagram(netip.MustParseAddr("127.0.0.1"), []byte(line))
	if len(sink.recs) != 1 {
		t.Fatalf("%d records, want 1", len(sink.recs))
	}
	r := sink.recs[0]
	want := route.DecisionRecord{
		ID: dec, Deployment: "llama", Model: "llama", Endpoint: srv, Pool: "llama_mixed", Outcome: "balanced",
		Session: true, State: "closed", Status: 200, TTFBMs: 56, TTFTMs: 789, DurationMs: 1234, Retries: 1, ServedBy: other, Start: r.Start,
		Term: route.TermState{'C', 'D'},
	}
	want.Request.Set([]byte("POST"), []byte("/v1/chat/completions"), []byte("req-42"))
	if r != want {
		t.Errorf("record\n got %+v\nwant %+v", r, want)
	}
	var closed route.DecisionRecord
	if !s.Ledger().LookupDecision(dec, time.Now(), &closed) || closed != want {
		t.Errorf("lookup after close: %+v", closed)
	}
	if s.Ledger().LookupDecision(dec, time.Now().Add(time.Hour), &closed) {
		t.Error("a decision an hour old is still found")
	}
	if s.Ledger().LookupDecision(dec^1<<40, time.Now(), &closed) {
		t.Error("an unknown id is found")
	}

	// The fields as the line and the lookup write them.
	var b bytes.Buffer
	zl := zerolog.New(&b)
	r.Fields(zl.Log()).Send()
	for _, f := range []string{`"decision":"` + id + `"`, `"deployment":"llama"`, `"model":"llama"`, `"endpoint":"` + srv + `"`,
		`"pool":"llama_mixed"`, `"outcome":"balanced"`, `"matched_blocks":0`, `"session":true`, `"status":200`,
		`"ttfb_ms":56`, `"ttft_ms":789`, `"duration_ms":1234`, `"retries":1`, `"served_by":"` + other + `"`, `"state":"closed"`, `"start":`,
		`"method":"POST"`, `"path":"/v1/chat/completions"`, `"request_id":"req-42"`, `"term":"CD"`, `"cut":"client"`} {
		if !strings.Contains(b.String(), f) {
			t.Errorf("line lacks %s: %s", f, b.String())
		}
	}

	if strings.Contains(b.String(), "secret") {
		t.Errorf("the line keeps the URI's query: %s", b.String())
	}

	ctx = routeCtx(chatBody("gpt-unknown", "sys", "hi"), "")
	ctx.Request.Header.Set("X-Request-Id", "req-43")
	s.api.Handler(ctx)
	if ctx.Response.StatusCode() != 404 || len(sink.recs) != 2 {
		t.Fatalf("unknown model: %d, %d records", ctx.Response.StatusCode(), len(sink.recs))
	}
	if r := sink.recs[1]; r.ID != 0 || r.Model != "gpt-unknown" || r.Status != 404 || r.Reason != "model_not_found" || r.Outcome != "refused" || r.TTFTMs != -1 ||
		string(r.Request.RequestID()) != "req-43" || string(r.Request.Method()) != "POST" {
		t.Errorf("refusal record: %+v", r)
	}

	// The same refusal asked again for its body (nginx header mode) is
	// answered alike but neither logged nor counted again.
	before := refusalCount(s, "model_not_found")
	ctx = routeCtx(chatBody("gpt-unknown", "sys", "hi"), "")
	ctx.Request.Header.Set(contract.HdrRepeat, "1")
	s.api.Handler(ctx)
	if ctx.Response.StatusCode() != 404 || !strings.Contains(string(ctx.Response.Body()), "gpt-unknown") {
		t.Fatalf("repeated refusal: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if len(sink.recs) != 2 {
		t.Errorf("a repeated refusal was logged again: %d records", len(sink.recs))
	}
	if after := refusalCount(s, "model_not_found"); after != before {
		t.Errorf("a repeated refusal was counted again: %s went %s -> %s", "model_not_found", before, after)
	}

	// Off: nothing more is written.
	s.Ledger().SetRequestSink(nil, 0)
	s.api.Handler(routeCtx(chatBody("gpt-unknown", "sys", "hi"), ""))
	if len(sink.recs) != 2 {
		t.Errorf("request log off wrote %d records", len(sink.recs)-2)
	}
}

// refusalCount is the turnout_refusals_total line of reason on s's /metrics.
func refusalCount(s *testServer, reason string) string {
	var b strings.Builder
	s.WriteMetrics(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "turnout_refusals_total{") && strings.Contains(l, `reason="`+reason+`"`) {
			return l
		}
	}
	return "(none)"
}

// TestRequestLogSampleRate: a rate logs about that fraction of decisions.
func TestRequestLogSampleRate(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", `"127.0.0.1"`, "s3cret-token-0123456789"))
	var sink recSink
	s.Ledger().SetRequestSink(&sink, 0.1)
	const n = 4000
	for range n {
		ctx := routeCtx(chatBody("llama", "sys", "hi"), "")
		s.api.Handler(ctx)
		s.Line([]byte("turnout-done id=" + hdr(ctx, contract.HdrDecision) + " status=200 ms=1 ttfb=1 tok=s3cret-token-0123456789"))
	}
	if got := len(sink.recs); got < n/10*7/10 || got > n/10*13/10 {
		t.Errorf("sample 0.1 of %d logged %d", n, got)
	}
}

// discardSink writes each record as the request log does, to nowhere.
type discardSink struct{ l zerolog.Logger }

func (d *discardSink) Request(r *route.DecisionRecord) { r.Fields(d.l.Log()).Msg("request") }

// BenchmarkDecideAndClose: one decision (HTTP transport) and the feedback
// line that closes it, with the request log off, at 1% and at 100% (to
// io.Discard: the cost of building and encoding the line, not of a disk).
func BenchmarkDecideAndClose(b *testing.B) {
	for _, rate := range []float64{0, 0.01, 1} {
		b.Run(fmt.Sprintf("sample=%g", rate), func(b *testing.B) {
			s := mustServer(b, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", `"127.0.0.1"`, "s3cret-token-0123456789"))
			if rate > 0 {
				s.Ledger().SetRequestSink(&discardSink{zerolog.New(io.Discard).With().Timestamp().Logger()}, rate)
			}
			ctx := routeCtx(chatBody("llama", "sys", "hi"), "user-1")
			line := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				s.api.Handler(ctx)
				line = append(line[:0], "turnout-done id="...)
				line = append(line, ctx.Response.Header.Peek(contract.HdrDecision)...)
				line = append(line, " srv=a status=200 ms=1234 ttfb=12 tok=s3cret-token-0123456789 retries=0"...)
				s.Line(line)
			}
		})
	}
}

// TestServedByUpstreamAddr: nginx's srv is turnout's choice even after a
// retry; the up= address of the replica that answered decides served_by
// (and which endpoint the line's figures count for).
func TestServedByUpstreamAddr(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", `"127.0.0.1"`, "s3cret-token-0123456789"))
	var sink recSink
	s.Ledger().SetRequestSink(&sink, 1)
	addr := map[string]string{"a": "127.0.0.1:8001", "b": "127.0.0.1:8002"}
	for _, tc := range []struct{ up, want string }{{"", "chosen"}, {"chosen", "chosen"}, {"other", "other"}, {"127.0.0.1:9", "chosen"}} {
		ctx := routeCtx(chatBody("llama", "sys", "hi"), "")
		s.api.Handler(ctx)
		chosen := hdr(ctx, contract.HdrServer)
		other := map[string]string{"a": "b", "b": "a"}[chosen]
		names := map[string]string{"chosen": chosen, "other": other}
		up := tc.up
		if n, ok := names[up]; ok {
			up = addr[n]
		}
		line := "turnout-done id=" + hdr(ctx, contract.HdrDecision) + " srv=" + chosen + " status=200 ms=5 ttfb=1 tok=s3cret-token-0123456789"
		if up != "" {
			line += " up=" + up
		}
		n := len(sink.recs)
		s.Line([]byte(line))
		if len(sink.recs) != n+1 {
			t.Fatalf("up=%q: no record", up)
		}
		if got := sink.recs[n].ServedBy; got != names[tc.want] {
			t.Errorf("up=%q: served_by %q, want %q", up, got, names[tc.want])
		}
	}
}
