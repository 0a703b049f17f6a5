package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/mock"
)

// The e2e driver against one in-process mock (no proxy): every request
// streams to [DONE], and the replica's own counters agree with the sim's
// token accounting.
func TestDriveAgainstMock(t *testing.T) {
	url := startTestMock(t, "r0")

	reqs := SyntheticTrace(20, 7)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := Drive(ctx, reqs, DriveOptions{URL: url, Model: "llama", Concurrency: 4, Compress: 1, TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != len(reqs) || res.Errors != 0 || res.Span <= 0 {
		t.Fatalf("requests %d errors %d span %v", res.Requests, res.Errors, res.Span)
	}
	for i := range res.TTFT {
		if res.TTFT[i] <= 0 || res.E2E[i] < res.TTFT[i] {
			t.Fatalf("sample %d: ttft %v e2e %v", i, res.TTFT[i], res.E2E[i])
		}
	}
	st := &Stack{Mocks: []Endpoint{{Name: "r0", Address: strings.TrimPrefix(url, "http://")}}}
	loads, err := st.ReplicaLoads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var prompt int64
	for i := range reqs {
		prompt += int64(PromptTokens(&reqs[i]))
	}
	if l := loads[0]; l.Requests != int64(len(reqs)) || l.PromptTokens != prompt || l.CachedTokens <= 0 {
		t.Fatalf("replica counters %+v, want %d requests and %d prompt tokens", l, len(reqs), prompt)
	}
}

// startTestMock starts an in-process mock replica (1000x faster than
// real time, no request log) until the test ends and returns its URL.
func startTestMock(t *testing.T, name string) string {
	t.Helper()
	log := zerolog.Nop()
	cfg := mock.DefaultConfig()
	cfg.Name, cfg.TimeScale, cfg.RequestLogSize = name, 0.001, -1
	srv, err := mock.New(cfg, &log)
	if err != nil {
		t.Fatal(err)
	}
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return url
}

// A 429 is a shed request, not an error: counted in Shed, -1 in ByIndex,
// and the served requests' TTFT lands at their trace index.
func TestDriveCountsShed(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 0 {
			http.Error(w, `{"error":{"message":"shed","type":"slo_shed"}}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	reqs := SyntheticTrace(10, 3)
	res, err := Drive(context.Background(), reqs, DriveOptions{URL: srv.URL, Model: "llama", Concurrency: 1, Compress: 1000, TimeScale: 0.001})
	if err != nil {
		t.Fatal(err)
	}
	if res.Shed != 5 || res.Errors != 0 || res.Requests != 5 {
		t.Fatalf("shed %d errors %d served %d, want 5, 0, 5", res.Shed, res.Errors, res.Requests)
	}
	served := 0
	for _, r := range reqs {
		if res.ByIndex[r.Index] > 0 {
			served++
		} else if res.ByIndex[r.Index] != -1 {
			t.Fatalf("request %d: ByIndex %v", r.Index, res.ByIndex[r.Index])
		}
	}
	if served != 5 {
		t.Fatalf("%d requests with a TTFT by index, want 5", served)
	}
}
