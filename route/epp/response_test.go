package epp

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The response phase: the response headers (with the gateway's served
// endpoint report) and the streamed body pass through untouched, each
// chunk once, and end_of_stream closes the decision with the status and
// the endpoint that served, as a feedback line does.
func TestEPP_ResponsePhaseClosesDecision(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	g.send(chatHeaders(false, "x-session-id", "r1"))
	g.sendBody(chat("llama", "hi"), 64<<10)
	p := routed(t, g.recv())
	if _, eos := streamedChunk(t, g.recv()); !eos {
		t.Fatal("the request body's one chunk lacks end_of_stream")
	}
	served := p.addrs()[1] // a retry: the first fallback answered
	g.send(respHeaders("200", served, false))
	if r := g.recv(); r.GetResponseHeaders() == nil || r.GetResponseHeaders().GetResponse().GetHeaderMutation() != nil {
		t.Fatalf("response headers answer %v, want an untouched continue", r)
	}
	chunks := [][]byte{[]byte("data: {\"choices\":[]}\n\n"), []byte("data: [DONE]\n\n")}
	for i, c := range chunks {
		if _, _, done := h.d.Ledger().Counts(); done != 0 {
			t.Fatalf("closed before the body's end (chunk %d)", i)
		}
		g.send(respBody(c, i == len(chunks)-1))
		b, eos := streamedChunk(t, g.recv())
		if !bytes.Equal(b, c) || eos != (i == len(chunks)-1) {
			t.Fatalf("chunk %d passed back as %q eos %v", i, b, eos)
		}
	}
	eventually(t, 5*time.Second, func() error {
		recs := h.log.all()
		if len(recs) != 1 {
			return fmt.Errorf("%d request log records", len(recs))
		}
		r := recs[0]
		if r.State != "closed" || r.Status != 200 || r.ServedBy != nameOf(served) || r.TTFBMs < 0 || r.DurationMs < r.TTFBMs {
			return fmt.Errorf("record %+v, want closed 200 served by %s", r, nameOf(served))
		}
		return nil
	})
}

func nameOf(addr string) string {
	for i, a := range llamaAddrs {
		if a == addr {
			return string(rune('a' + i))
		}
	}
	return ""
}

// A non-streamed response mode gets plain continues; the trailers close
// the decision.
func TestEPP_ResponseTrailersClose(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	g.send(withMode(reqHeaders(true, ":method", "GET", ":path", "/v1/models", "x-model", "qwen"), filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED))
	routed(t, g.recv())
	g.send(respHeaders("503", "", false))
	g.recv()
	g.send(respBody([]byte(`{"error":"busy"}`), false))
	if r := g.recv(); r.GetResponseBody() == nil || r.GetResponseBody().GetResponse() != nil {
		t.Fatalf("BUFFERED response body answer %v, want a plain continue", r)
	}
	g.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	if r := g.recv(); r.GetResponseTrailers() == nil {
		t.Fatalf("trailers answer %v", r)
	}
	eventually(t, 5*time.Second, func() error {
		if recs := h.log.all(); len(recs) != 1 || recs[0].Status != 503 || recs[0].State != "closed" {
			return fmt.Errorf("records %+v", recs)
		}
		return nil
	})
}

// A stream that ends without a response phase leaves the decision open
// (decision_ttl expires it); one that ends after its response headers
// closes it with what was known.
func TestEPP_StreamEndWithoutResponseLeavesDecision(t *testing.T) {
	h := newHarness(t, fleetYAML)
	g := h.open(t)
	g.send(reqHeaders(true, ":method", "GET", ":path", "/", "x-model", "qwen"))
	routed(t, g.recv())
	_ = g.c.CloseSend()
	if _, err := g.c.Recv(); err == nil {
		t.Fatal("stream still open")
	}
	g2 := h.open(t)
	g2.send(reqHeaders(true, ":method", "GET", ":path", "/", "x-model", "qwen"))
	routed(t, g2.recv())
	g2.send(respHeaders("200", "", false))
	g2.recv()
	g2.cancel() // the client went away mid-response
	eventually(t, 5*time.Second, func() error {
		opened, completed, _ := h.d.Ledger().Counts()
		if opened != 2 || completed != 1 {
			return fmt.Errorf("opened %d completed %d, want 2 and 1", opened, completed)
		}
		return nil
	})
	if recs := h.log.all(); len(recs) != 1 || recs[0].Status != 200 || !strings.Contains(recs[0].Endpoint, "q") {
		t.Fatalf("records %+v", recs)
	}
}
