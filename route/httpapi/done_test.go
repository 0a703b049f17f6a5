package httpapi

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
)

// openIDs routes n requests and returns their decision ids.
func openIDs(t *testing.T, s *testServer, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		id := hdr(do(s, chatBody("llama", "", "x")), contract.HdrDecision)
		if len(id) != 16 {
			t.Fatalf("decision id %q is not 16 hex digits", id)
		}
		ids = append(ids, id)
	}
	return ids
}

func totalInflight(s *testServer) (n int64) {
	for _, p := range s.Snapshot().Pools() {
		for _, e := range p.Endpoints {
			n += e.Inflight()
		}
	}
	return n
}

const feedbackCfg = routetest.FeedbackCfg

func doneCtx(id, remote, token string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.SetRequestURI(contract.PathDone + "?id=" + id)
	req.Header.SetMethod("POST")
	if token != "" {
		req.Header.Set(contract.HdrToken, token)
	}
	ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(remote), Port: 40000}, nil)
	return &ctx
}

// Finding 6: /internal/done answers only feedback.sources, with the token if set.
func TestDoneProtected(t *testing.T) {
	const tok = "s3cret-token-0123456789"
	for _, tc := range []struct {
		name, token, remote, send string
		status                    int
	}{
		{"foreign address", "", "192.0.2.7", "", 403},
		{"loopback", "", "127.0.0.1", "", 204},
		{"loopback without token", tok, "127.0.0.1", "", 403},
		{"loopback wrong token", tok, "127.0.0.1", "nope-nope-nope-nope", 403},
		{"loopback with token", tok, "127.0.0.1", tok, 204},
		{"foreign with token", tok, "192.0.2.7", tok, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", tc.token))
			id := openIDs(t, s, 1)[0]
			ctx := doneCtx(id, tc.remote, tc.send)
			s.Handler(ctx)
			if ctx.Response.StatusCode() != tc.status {
				t.Fatalf("status %d, want %d: %s", ctx.Response.StatusCode(), tc.status, ctx.Response.Body())
			}
			if want := int64(0); tc.status != 204 {
				want = 1
				if totalInflight(s) != want {
					t.Fatalf("refused call changed inflight to %d", totalInflight(s))
				}
			}
		})
	}
}

// Finding 6: feedback listening beyond loopback is worth a warning.

// Custom glue hands the first-token time over with the id: it reaches the
// ledger's record and the endpoint's histogram; a bad value is refused
// with the decision left open, and without one the record says unknown.
func TestDoneFirstToken(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", ""))
	ids := openIDs(t, s, 3)
	call := func(id, query string) int {
		ctx := doneCtx(id, "127.0.0.1", "")
		ctx.Request.SetRequestURI(contract.PathDone + "?id=" + id + query)
		s.Handler(ctx)
		return ctx.Response.StatusCode()
	}
	record := func(id string) route.DecisionRecord {
		t.Helper()
		n, ok := contract.ParseDecisionID([]byte(id))
		var r route.DecisionRecord
		if !ok || !s.Ledger().LookupDecision(n, time.Now(), &r) {
			t.Fatalf("decision %s not found", id)
		}
		return r
	}
	if st := call(ids[0], "&tft=abc"); st != 400 || record(ids[0]).State != "open" {
		t.Fatalf("tft=abc: status %d, state %s; want 400 and the decision open", st, record(ids[0]).State)
	}
	if st := call(ids[0], "&tft=-5"); st != 400 {
		t.Fatalf("tft=-5: status %d, want 400", st)
	}
	if st := call(ids[0], "&tft=321"); st != 204 {
		t.Fatalf("tft=321: status %d", st)
	}
	if r := record(ids[0]); r.State != "closed" || r.TTFTMs != 321 || r.TTFBMs != -1 {
		t.Fatalf("record after tft=321: %+v", r)
	}
	if st := call(ids[1], ""); st != 204 {
		t.Fatalf("no tft: status %d", st)
	}
	if r := record(ids[1]); r.State != "closed" || r.TTFTMs != -1 {
		t.Fatalf("record without tft: %+v", r)
	}
	var b strings.Builder
	s.WriteMetrics(&b)
	var count uint64
	for _, line := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "turnout_endpoint_first_token_seconds_count{"); ok {
			var n uint64
			_, _ = fmt.Sscan(v[strings.IndexByte(v, '}')+1:], &n)
			count += n
		}
	}
	if count != 1 || !strings.Contains(b.String(), `turnout_endpoint_first_token_seconds_bucket{deployment="llama",pool="llama_mixed",endpoint=`) {
		t.Fatalf("first-token histogram counts %d completions, want 1:\n%s", count, b.String())
	}
}
