package httpapi

import (
	"fmt"
	"net"
	"testing"

	"github.com/valyala/fasthttp"

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
