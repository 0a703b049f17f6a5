package bench

import (
	"context"
	"strings"
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
