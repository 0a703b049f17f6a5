package mock

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// The mock must not be the bottleneck of turnout's throughput benchmark, so
// these measure a whole request over loopback TCP at TimeScale 0 (client
// cost included).
func benchServe(b *testing.B, path, body string) {
	cfg := DefaultConfig()
	cfg.TimeScale = 0
	cfg.MaxRunning = 0
	s, err := New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	client := &fasthttp.Client{MaxConnsPerHost: 1024}
	url := base + path
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		for pb.Next() {
			req.SetRequestURI(url)
			req.Header.SetMethod(fasthttp.MethodPost)
			req.SetBodyString(body)
			if err := client.Do(req, resp); err != nil {
				b.Error(err)
				return
			}
			if resp.StatusCode() != 200 {
				b.Errorf("status %d", resp.StatusCode())
				return
			}
		}
	})
}

var benchPrompt = strings.Repeat("the quick brown fox jumps over the lazy dog ", 60) // ~540 tokens

func BenchmarkChatNonStreaming(b *testing.B) {
	benchServe(b, PathChat, chatBody(benchPrompt, `,"max_tokens":16`))
}

func BenchmarkChatStreaming(b *testing.B) {
	benchServe(b, PathChat, chatBody(benchPrompt, `,"max_tokens":16,"stream":true,"stream_options":{"include_usage":true}`))
}

func BenchmarkCacheServe(b *testing.B) {
	c := NewCache(16, 4096)
	toks := Tokenize(benchPrompt)
	b.ReportAllocs()
	for b.Loop() {
		c.Serve(toks)
	}
}
