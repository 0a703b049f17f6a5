package tokenize

import (
	"errors"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/kv"
)

// fakeVLLM answers /tokenize with the given body and status, recording requests.
func fakeVLLM(t *testing.T, status int, answer string) (string, *atomic.Int64, *atomic.Pointer[string]) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	var last atomic.Pointer[string]
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		calls.Add(1)
		b := string(ctx.PostBody())
		last.Store(&b)
		if string(ctx.Path()) != "/tokenize" {
			ctx.SetStatusCode(404)
			return
		}
		ctx.SetStatusCode(status)
		ctx.SetBodyString(answer)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String(), &calls, &last
}

func TestKeysAndCache(t *testing.T) {
	addr, calls, last := fakeVLLM(t, 200, `{"count":4,"tokens":[1,2,3,4],"token_strs":null}`)
	c := New(Options{Timeout: 2 * time.Second, CacheEntries: 2}, []string{addr})
	raw := []byte(`[{"role":"user","content":"hi"}]`)
	want := kv.BlockKeys([]uint32{1, 2, 3, 4}, 2, nil)
	for i := 0; i < 3; i++ {
		keys, err := c.Keys("messages", raw, []byte(`m"x`), 2)
		if err != nil || !slices.Equal(keys, want) {
			t.Fatalf("keys %v %v, want %v", keys, err, want)
		}
	}
	if calls.Load() != 1 || c.Hits() != 2 {
		t.Fatalf("calls %d hits %d: repeats must come from the cache", calls.Load(), c.Hits())
	}
	if got := *last.Load(); got != `{"model":"m\"x","messages":[{"role":"user","content":"hi"}]}` {
		t.Fatalf("sent %s", got)
	}
	// Another block size is another key set.
	if _, err := c.Keys("messages", raw, []byte("m"), 4); err != nil || calls.Load() != 2 {
		t.Fatalf("block size 4: %v, calls %d", err, calls.Load())
	}
	// A reload with the same cache size keeps it.
	d := New(Options{Timeout: time.Second, CacheEntries: 2}, []string{addr})
	d.Adopt(c)
	if _, err := d.Keys("messages", raw, []byte(`m"x`), 2); err != nil || calls.Load() != 2 || d.Hits() != 1 {
		t.Fatalf("adopted cache: %v calls %d hits %d", err, calls.Load(), d.Hits())
	}
}

func TestKeysErrors(t *testing.T) {
	bad, _, _ := fakeVLLM(t, 500, `{}`)
	junk, _, _ := fakeVLLM(t, 200, `{"tokens":[1,-2]}`)
	for _, tc := range []struct {
		name  string
		addrs []string
		raw   string
		unav  bool
	}{
		{"no address", nil, `"p"`, true},
		{"500", []string{bad}, `"p"`, true},
		{"out of range tokens", []string{junk}, `"p"`, true},
		{"no prompt", []string{bad}, ``, false},
	} {
		c := New(Options{Timeout: time.Second, CacheEntries: 4}, tc.addrs)
		_, err := c.Keys("prompt", []byte(tc.raw), []byte("m"), 2)
		if err == nil || errors.Is(err, ErrUnavailable) != tc.unav {
			t.Errorf("%s: %v (unavailable %v)", tc.name, err, errors.Is(err, ErrUnavailable))
		}
	}
}
