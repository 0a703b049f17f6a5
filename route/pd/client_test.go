package pd

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

const kvAnswer = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[1,2,3],"remote_host":"127.0.0.1","remote_port":1234,"tp_size":1}`

// seen is what the replica received of one prefill call.
type seen struct{ method, uri, ctype, auth, session, other, body string }

// replica is a prefill replica that answers by the request's path, so one
// server covers every answer; it reports each request on got.
func replica(t *testing.T) (addr string, got chan seen) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got = make(chan seen, 16)
	release := make(chan struct{})
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		h := &ctx.Request.Header
		got <- seen{string(h.Method()), string(ctx.RequestURI()), string(h.ContentType()), string(h.Peek("Authorization")),
			string(h.Peek("X-Session-Id")), string(h.Peek("X-Other")), string(ctx.PostBody())}
		switch string(ctx.Path()) {
		case "/400":
			ctx.SetStatusCode(400)
			ctx.SetBodyString(`{"error":{"message":"prompt too long","code":400}}`)
		case "/503":
			ctx.SetStatusCode(503)
			ctx.SetBodyString(`overloaded`)
		case "/nokv":
			ctx.SetBodyString(`{"id":"x","choices":[]}`)
		case "/nullkv":
			ctx.SetBodyString(`{"id":"x","kv_transfer_params":null}`)
		case "/slow":
			<-release
		case "/other":
			// Another answer of the same length: where a buffer is reused,
			// every byte of an earlier answer's kv params changes.
			ctx.SetBodyString(`{"id":"y","choices":[{"text":"b"}],"kv_transfer_params":` + strings.Repeat("x", len(kvAnswer)) + `}`)
		default:
			ctx.SetBodyString(`{"id":"x","choices":[{"text":"a"}],"kv_transfer_params":` + kvAnswer + `}`)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { close(release); _ = srv.Shutdown() })
	return ln.Addr().String(), got
}

// hdrs is a Headers that copies a fixed list.
type hdrs [][2]string

func (l hdrs) CopyTo(h *fasthttp.RequestHeader) {
	for _, kv := range l {
		h.Set(kv[0], kv[1])
	}
}

func TestPrefill(t *testing.T) {
	addr, got := replica(t)
	c := New()
	body := `{"model":"m","prompt":"x","max_tokens":1,"stream":false}`
	fwd := hdrs{{"Authorization", "Bearer k"}, {"X-Session-Id", "s1"}}
	for _, tc := range []struct {
		name, uri string
		headers   Headers
		wantURI   string
		wantKV    string
		status    int   // a *StatusError with this status
		is        error // errors.Is
	}{
		{name: "kv params", uri: "/v1/completions?x=1", headers: fwd, wantURI: "/v1/completions?x=1", wantKV: kvAnswer},
		{name: "no uri: chat completions", wantURI: DefaultURI, wantKV: kvAnswer},
		{name: "uri not a path", uri: "v1/x", wantURI: DefaultURI, wantKV: kvAnswer},
		{name: "bad request", uri: "/400", headers: fwd, wantURI: "/400", status: 400},
		{name: "replica failing", uri: "/503", wantURI: "/503", status: 503},
		{name: "no kv_transfer_params", uri: "/nokv", wantURI: "/nokv", is: ErrNoKVParams},
		{name: "kv_transfer_params not an object", uri: "/nullkv", wantURI: "/nullkv", is: ErrNoKVParams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv, err := c.Prefill(&Call{Address: addr, URI: []byte(tc.uri), Headers: tc.headers, Body: []byte(body), Timeout: 5 * time.Second})
			r := <-got
			if r.method != "POST" || r.uri != tc.wantURI || r.ctype != "application/json" || r.body != body {
				t.Fatalf("replica got %+v", r)
			}
			if tc.headers != nil && (r.auth != "Bearer k" || r.session != "s1" || r.other != "") {
				t.Fatalf("headers: %+v", r)
			}
			var st *StatusError
			switch {
			case tc.status != 0:
				if !errors.As(err, &st) || st.Status != tc.status || len(st.Body) == 0 || kv != nil {
					t.Fatalf("want status %d, got %v (%v)", tc.status, err, kv)
				}
			case tc.is != nil:
				if !errors.Is(err, tc.is) || errors.As(err, &st) {
					t.Fatalf("want %v, got %v", tc.is, err)
				}
			default:
				if err != nil || string(kv) != tc.wantKV {
					t.Fatalf("kv %s (%v), want %s", kv, err, tc.wantKV)
				}
			}
		})
	}
}

// The kv params are the caller's: released fasthttp buffers are reused by
// the next call.
func TestPrefillKVCopied(t *testing.T) {
	addr, got := replica(t)
	c := New()
	kv, err := c.Prefill(&Call{Address: addr, Body: []byte(`{}`), Timeout: 5 * time.Second})
	<-got
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		if _, err := c.Prefill(&Call{Address: addr, URI: []byte("/other"), Body: []byte(`{}`), Timeout: 5 * time.Second}); !errors.Is(err, ErrNoKVParams) {
			t.Fatalf("other answer: %v", err)
		}
		<-got
		if string(kv) != kvAnswer {
			t.Fatalf("kv changed under the caller after %d calls: %s", i+1, kv)
		}
	}
}

// A slow or absent replica is a transport error, never a status, and the
// timeout holds.
func TestPrefillTransportErrors(t *testing.T) {
	addr, got := replica(t)
	c := New()
	start := time.Now()
	_, err := c.Prefill(&Call{Address: addr, URI: []byte("/slow"), Body: []byte(`{}`), Timeout: 100 * time.Millisecond})
	<-got
	var st *StatusError
	if !errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &st) {
		t.Fatalf("slow replica: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("timeout 100ms took %v", d)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	if _, err := c.Prefill(&Call{Address: closed, Body: []byte(`{}`), Timeout: time.Second}); err == nil || errors.As(err, &st) {
		t.Fatalf("closed port: %v", err)
	}
}
