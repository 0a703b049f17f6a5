package route

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
	"github.com/turnout/turnout/route/payload"
	"github.com/turnout/turnout/route/policy"
)

// route.DecodeBody is the glue's reference; it must stay payload.DecodeBody.
func TestDecodeBody(t *testing.T) {
	kv := `{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":5}`
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"kv_transfer_params":` + kv + `,"model":"m","stream":true}`},
		{` { } `, ` {"kv_transfer_params":` + kv + ` } `},
		{`{"messages":[{"content":"日本語"}]}`, `{"kv_transfer_params":` + kv + `,"messages":[{"content":"日本語"}]}`},
	} {
		got, err := DecodeBody([]byte(tc.in), []byte(kv))
		if err != nil || string(got) != tc.want || !json.Valid(got) {
			t.Fatalf("DecodeBody(%s) = %s (%v)", tc.in, got, err)
		}
	}
}

// fakePrefill is a prefill replica answering per mode.
type fakePrefill struct {
	addr   string
	mode   atomic.Value // "ok", "500", "400", "nokv"
	calls  atomic.Int64
	bodies chan []byte
}

func startFakePrefill(t *testing.T) *fakePrefill {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePrefill{addr: ln.Addr().String(), bodies: make(chan []byte, 64)}
	f.mode.Store("ok")
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		f.calls.Add(1)
		select {
		case f.bodies <- append([]byte(nil), ctx.PostBody()...):
		default:
		}
		switch f.mode.Load().(string) {
		case "500":
			ctx.SetStatusCode(500)
			ctx.SetBodyString(`{"error":{"message":"boom"}}`)
		case "400":
			ctx.SetStatusCode(400)
			ctx.SetBodyString(`{"error":{"message":"prompt too long","type":"BadRequestError","code":400}}`)
		case "nokv":
			ctx.SetBodyString(`{"id":"x","choices":[]}`)
		default:
			ctx.SetBodyString(`{"id":"x","choices":[{"text":"a"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"eng-` + f.addr + `","remote_block_ids":[1,2,3],"remote_host":"127.0.0.1","remote_port":1234,"tp_size":1}}`)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return f
}

func pdServer(t *testing.T, extra string, prefills ...*fakePrefill) *Decider {
	var eps []string
	for i, f := range prefills {
		eps = append(eps, fmt.Sprintf("{name: p%d, address: %s}", i, f.addr))
	}
	return mustServer(t, fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: prefix-affinity, params: {block_bytes: 64}}
    pd: {prefill_timeout: 2s%s}
    pools:
      - role: prefill
        endpoints: [%s]
      - role: decode
        endpoints: [{name: d0, address: 127.0.0.1:9101}, {name: d1, address: 127.0.0.1:9102}]
`, extra, strings.Join(eps, ", ")))
}

func TestRoutePD(t *testing.T) {
	a, b := startFakePrefill(t), startFakePrefill(t)
	s := pdServer(t, "", a, b)
	body := `{"model":"llama","messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 50) + `"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50}`

	ctx := do(s, body, "X-Session-Id", "s1", contract.HdrOriginalURI, "/v1/chat/completions")
	if ctx.Response.StatusCode() != 200 || !strings.HasPrefix(hdr(ctx, contract.HdrServer), "d") || hdr(ctx, contract.HdrPool) != "llama_decode" {
		t.Fatalf("verdict %d %s", ctx.Response.StatusCode(), ctx.Response.Header.String())
	}
	// The body edit: inserted at the offset, it gives DecodeBody exactly.
	ins, err := base64.StdEncoding.DecodeString(hdr(ctx, contract.HdrKVInsert))
	if err != nil || !strings.Contains(string(ins), `"remote_block_ids":[1,2,3]`) {
		t.Fatalf("kv header %q: %v", ins, err)
	}
	at, err := strconv.Atoi(hdr(ctx, contract.HdrKVAt))
	if err != nil || at != 1 {
		t.Fatalf("kv at %q: %v", hdr(ctx, contract.HdrKVAt), err)
	}
	kv := ins[len(payload.EditKey) : len(ins)-len(payload.EditSep)]
	if want, _ := DecodeBody([]byte(body), kv); body[:at]+string(ins)+body[at:] != string(want) {
		t.Fatalf("edit gives %s, want %s", body[:at]+string(ins)+body[at:], want)
	}
	var sent map[string]any
	if err := json.Unmarshal(<-firstBodies(a, b), &sent); err != nil {
		t.Fatal(err)
	}
	if sent["max_tokens"].(float64) != 1 || sent["stream"] != false || sent["stream_options"] != nil {
		t.Fatalf("prefill body: %v", sent)
	}
	if p := sent["kv_transfer_params"].(map[string]any); p["do_remote_decode"] != true || p["do_remote_prefill"] != false {
		t.Fatalf("prefill kv params: %v", p)
	}

	// One replica failing: retried on the other.
	a.mode.Store("500")
	b.mode.Store("ok")
	for i := 0; i < 6; i++ {
		ctx = do(s, body)
		if ctx.Response.StatusCode() != 200 || hdr(ctx, contract.HdrPrefill) != "p1" {
			t.Fatalf("retry: %d prefill=%s", ctx.Response.StatusCode(), hdr(ctx, contract.HdrPrefill))
		}
	}
	// Both failing: a clear 502, nothing for decode.
	b.mode.Store("500")
	ctx = do(s, body)
	if ctx.Response.StatusCode() != 502 || hdr(ctx, contract.HdrServer) != "" {
		t.Fatalf("both failing: %d %s", ctx.Response.StatusCode(), ctx.Response.Header.String())
	}
	if e := routetest.ErrBody(t, ctx.Response.Body()); e.Code != "prefill_failed" {
		t.Fatalf("code %s", e.Code)
	}
	// The replica rejects the request itself: relayed, not retried.
	a.mode.Store("400")
	b.mode.Store("400")
	before := a.calls.Load() + b.calls.Load()
	ctx = do(s, body)
	if ctx.Response.StatusCode() != 400 || a.calls.Load()+b.calls.Load() != before+1 {
		t.Fatalf("4xx relay: %d, calls %d", ctx.Response.StatusCode(), a.calls.Load()+b.calls.Load()-before)
	}
	a.mode.Store("nokv")
	b.mode.Store("nokv")
	if ctx = do(s, body); ctx.Response.StatusCode() != 502 {
		t.Fatalf("missing kv params: %d", ctx.Response.StatusCode())
	}
}

func firstBodies(fs ...*fakePrefill) chan []byte {
	out := make(chan []byte, 1)
	for _, f := range fs {
		select {
		case b := <-f.bodies:
			out <- b
			return out
		default:
		}
	}
	close(out)
	return out
}

func TestRoutePDRefusals(t *testing.T) {
	a := startFakePrefill(t)
	s := pdServer(t, "", a)
	for _, tc := range []struct {
		name, body string
		hdrs       []string
		status     int
		code       string
	}{
		{"client kv params", `{"model":"llama","prompt":"x","kv_transfer_params":{"do_remote_prefill":true}}`, nil, 400, "kv_transfer_params_not_allowed"},
		{"truncated", `{"model":"llama","prompt":"xxxx`, []string{contract.HdrBodyTruncated, "16/100000"}, 413, "body_too_large"},
		{"not json", `garbage`, nil, 400, "invalid_body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := do(s, tc.body, tc.hdrs...)
			if ctx.Response.StatusCode() != tc.status || routetest.ErrBody(t, ctx.Response.Body()).Code != tc.code {
				t.Fatalf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
			}
		})
	}
	// Issue 28: with a second deployment the model picks the pool, and two
	// "model" keys are refused before the prefill call, which would carry them.
	two := mustServer(t, fmt.Sprintf(`
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    pd: {prefill_timeout: 2s}
    pools:
      - {role: prefill, endpoints: [{name: p0, address: %s}]}
      - {role: decode, endpoints: [{name: d0, address: 127.0.0.1:9101}]}
  - name: other
    models: [other]
    pools: [{endpoints: [{name: o, address: 127.0.0.1:9109}]}]
`, a.addr))
	ctx := do(two, `{"model":"llama","prompt":"x","model":"other"}`)
	if ctx.Response.StatusCode() != 400 || routetest.ErrBody(t, ctx.Response.Body()).Code != contract.ReasonDuplicateModel {
		t.Fatalf("duplicate model: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if a.calls.Load() != 0 {
		t.Fatal("refused requests reached the prefill replica")
	}
}

func TestRoutePDNoPrefill(t *testing.T) {
	a := startFakePrefill(t)
	for _, tc := range []struct {
		mode   string
		status int
	}{{"aggregate", 200}, {"reject", 503}} {
		s := pdServer(t, ", no_prefill: "+tc.mode, a)
		s.Snapshot().Deployments[0].Prefill.Endpoints[0].SetDown(true)
		ctx := do(s, `{"model":"llama","prompt":"x"}`)
		if ctx.Response.StatusCode() != tc.status || hdr(ctx, contract.HdrKVInsert) != "" {
			t.Fatalf("%s: %d", tc.mode, ctx.Response.StatusCode())
		}
	}
}

// Prefill and decode pools of one deployment keep separate prefix indexes.
func TestPDIndexesIsolated(t *testing.T) {
	a := startFakePrefill(t)
	s := pdServer(t, "", a)
	body := `{"model":"llama","prompt":"` + strings.Repeat("shared prefix ", 40) + `"}`
	if ctx := do(s, body); ctx.Response.StatusCode() != 200 {
		t.Fatalf("%d", ctx.Response.StatusCode())
	}
	d := s.Snapshot().Deployments[0]
	pre := d.Prefill.Policy.(*policy.PrefixAffinity)
	dec := d.Serve.Policy.(*policy.PrefixAffinity)
	if pre == dec || pre.CachedBlocks(0) == 0 {
		t.Fatal("prefill index empty or shared")
	}
	total := 0
	for i := range d.Serve.Endpoints {
		total += dec.CachedBlocks(i)
	}
	if total != pre.CachedBlocks(0) {
		t.Fatalf("decode index %d blocks, prefill %d: each pool records its own pick", total, pre.CachedBlocks(0))
	}
	// Drop the decode entries: prefill's must stay.
	for i := range d.Serve.Endpoints {
		dec.Forget(i)
	}
	if pre.CachedBlocks(0) == 0 {
		t.Fatal("prefill index shared with decode")
	}
}

func TestPDSkipPrefill(t *testing.T) {
	a := startFakePrefill(t)
	s := pdServer(t, ", skip_prefill_below: 256", a)
	body := `{"model":"llama","prompt":"` + strings.Repeat("cached prefix ", 60) + `"}`
	do(s, body) // first: prefill, records the decode index
	calls := a.calls.Load()
	ctx := do(s, body)
	if ctx.Response.StatusCode() != 200 || hdr(ctx, contract.HdrKVInsert) != "" || a.calls.Load() != calls {
		t.Fatalf("expected skip: %d kv=%q calls %d->%d", ctx.Response.StatusCode(), hdr(ctx, contract.HdrKVInsert), calls, a.calls.Load())
	}
}

// The prefill call carries auth, the request id and the session headers of
// the original request, nothing else.
func TestPDHeaders(t *testing.T) {
	s := pdServer(t, "", startFakePrefill(t))
	var in contract.Input
	for _, h := range [][2]string{{"authorization", "Bearer k"}, {"X-Request-ID", "r1"}, {"X_Session_Id", "s1"}, {"X-User", "u"}, {"Cookie", "c"}} {
		in.AddHeader([]byte(h[0]), []byte(h[1]))
	}
	var req fasthttp.RequestHeader
	(&pdHeaders{in: &in, snap: s.Snapshot()}).CopyTo(&req)
	got := map[string]string{}
	req.VisitAll(func(k, v []byte) { got[strings.ToLower(string(k))] = string(v) })
	want := map[string]string{"authorization": "Bearer k", "x-request-id": "r1", "x_session_id": "s1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("prefill headers %v, want %v", got, want)
	}
}

// A prefill/decode deployment is two passes of the one pipeline (the
// decode pool's pick, then the prefill pool's); a mixed deployment is one.
// The prefill pass's skipped pick is marked, never routed to.
func TestDeploymentPasses(t *testing.T) {
	a := startFakePrefill(t)
	s := pdServer(t, ", skip_prefill_below: 256", a)
	d := s.Snapshot().Deployments[0]
	if len(d.Passes) != 2 || d.Passes[0].Pool != d.Serve || d.Passes[0].Role != PassServe ||
		d.Passes[1].Pool != d.Prefill || d.Passes[1].Role != PassPrefill {
		t.Fatalf("PD passes: %+v", d.Passes)
	}
	m := mustServer(t, `
health: {disable: true}
deployments: [{name: m, models: [m], pools: [{endpoints: [{name: m0, address: "127.0.0.1:9103"}]}]}]
`)
	if md := m.Snapshot().Deployments[0]; len(md.Passes) != 1 || md.Passes[0].Pool != md.Serve || md.Passes[0].Role != PassServe {
		t.Fatalf("mixed passes: %+v", md.Passes)
	}
	// Served twice: the second time the decode replica holds the prompt and
	// the prefill pass is skipped, counted as such.
	body := `{"model":"llama","prompt":"` + strings.Repeat("cached prefix ", 60) + `"}`
	do(s, body)
	before := s.m.pdPrefill[3].Load()
	if ctx := do(s, body); hdr(ctx, contract.HdrPrefill) != "" {
		t.Fatalf("skipped prefill still names a prefill replica: %q", hdr(ctx, contract.HdrPrefill))
	}
	if s.m.pdPrefill[3].Load() != before+1 {
		t.Fatalf("skipped prefills: %d -> %d", before, s.m.pdPrefill[3].Load())
	}
}
