//go:build e2e

package e2e

// Prefill/decode disaggregation through HAProxy (issue 6): turnout runs the
// prefill on a prefill replica, HAProxy's Lua inserts the returned
// kv_transfer_params into the body and streams the decode replica's answer.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// hpdStack is turnout + HAProxy in front of a PD deployment "pd" (2 prefill,
// 2 decode replicas) and a mixed deployment "chat" (1 replica).
type hpdStack struct {
	dir, turnoutAddr, haAddr, syslog string
	spoeAddr                         string // set: HAProxy asks turnout over SPOE
	gone                             string // pdr's prefill replica: nothing listens
	prefill, decode, mixed           []*Mock
	T                                *Turnout
	H                                *HAProxy
	client                           *http.Client
}

// hpdMaxBody is small so the 413 test needs no huge body; the decode body
// still gets room for kv_transfer_params on top (tune.bufsize follows).
const hpdMaxBody = 65536

func (s *hpdStack) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, `listen: %s
session_headers: [x-session-id]
max_body: %d
fallbacks: 1
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
proxy:
  fail_mode: open
  route_timeout: 5s
  breaker_failures: 3
  breaker_cooldown: 30s
haproxy: {listen: %q, dir: %q, drain_timeout: 3s, nbthread: 2, %s}
deployments:
  - name: pd
    models: [pd, llama]   # llama: the shared openai npm client test asks for it
    policy: {name: round-robin}
    pd: {prefill_timeout: 5s, no_prefill: aggregate}
    pools:
`, s.turnoutAddr, hpdMaxBody, s.syslog, s.haAddr, s.dir, haproxyPathYAML(s.spoeAddr))
	pool := func(indent, role string, ms []*Mock) {
		fmt.Fprintf(&b, "%s- role: %s\n%s  endpoints:\n", indent, role, indent)
		for _, m := range ms {
			fmt.Fprintf(&b, "%s    - {name: %s, address: %q}\n", indent, m.Name, m.Addr)
		}
	}
	pool("      ", config.RolePrefill, s.prefill)
	pool("      ", config.RoleDecode, s.decode)
	b.WriteString("  - name: chat\n    models: [chat]\n    policy: {name: least-request}\n    pools:\n")
	pool("      ", config.RoleMixed, s.mixed)
	// pdr refuses rather than serving aggregated, and its one prefill
	// replica never answers (nothing listens at s.gone). Its prefill_timeout
	// also sets the SPOE timeout processing, which fail-open waits out once.
	fmt.Fprintf(&b, "  - name: pdr\n    models: [pdr]\n    policy: {name: round-robin}\n    pd: {prefill_timeout: 5s, no_prefill: reject}\n    pools:\n")
	pool("      ", config.RolePrefill, []*Mock{{Name: "gone", Addr: s.gone}})
	// Its decode pool: the pd replicas under other names (names are global).
	pool("      ", config.RoleDecode, []*Mock{{Name: "pdr-" + s.decode[0].Name, Addr: s.decode[0].Addr}})
	return b.String()
}

func startHPD(t *testing.T, spoeAddr string) *hpdStack {
	t.Helper()
	NeedHAProxy(t)
	role := func(r mock.Role) func(*mock.Config) {
		// The PD replicas serve both names of the pd deployment (turnout
		// refuses at load a name they would answer 404 for).
		return func(c *mock.Config) { c.Role, c.Models = r, []string{"pd", "llama"} }
	}
	s := &hpdStack{
		dir: t.TempDir(), turnoutAddr: FreeAddr(t), haAddr: FreeAddr(t), syslog: FreeUDPAddr(t),
		prefill:  mocks(t, "pre", 2, role(mock.RolePrefill)),
		decode:   mocks(t, "dec", 2, role(mock.RoleDecode)),
		mixed:    mocks(t, "mix", 1, nil),
		spoeAddr: spoeAddr,
		gone:     FreeAddr(t),
		client:   &http.Client{Timeout: 30 * time.Second},
	}
	s.T = StartTurnout(t, s.turnoutAddr, s.yaml(), "--haproxy-dir", s.dir, "--watch", "100ms")
	s.H = StartRenderedHAProxy(t, s.dir, s.haAddr)
	var ids []string
	for _, m := range s.prefill {
		ids = append(ids, "pd_prefill/"+m.Name)
	}
	for _, m := range s.decode {
		ids = append(ids, "pd_decode/"+m.Name)
	}
	ids = append(ids, "chat_mixed/"+s.mixed[0].Name)
	s.H.WaitServersUp(t, ids...)
	return s
}

func (s *hpdStack) post(t *testing.T, body []byte, hdr map[string]string) *Response {
	t.Helper()
	r, err := Post(context.Background(), s.client, s.H.URL+"/v1/chat/completions", body, hdr)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return r
}

func (s *hpdStack) pdMocks() []*Mock { return slices.Concat(s.prefill, s.decode) }

func (s *hpdStack) decodeByName(name string) *Mock {
	for _, m := range s.decode {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// hpdLogged is one entry of a mock's GET /mock/requests. Body keeps the raw
// JSON the replica received (trimmed of outer whitespace by the mock).
type hpdLogged struct {
	Path    string            `json:"path"`
	Body    json.RawMessage   `json:"body"`
	Headers map[string]string `json:"headers"`
}

func hpdRequests(t *testing.T, m *Mock) []hpdLogged {
	t.Helper()
	res, err := http.Get("http://" + m.Addr + mock.PathRequests)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out []hpdLogged
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: %v", m.Name, mock.PathRequests, err)
	}
	var chats []hpdLogged
	for _, e := range out {
		if e.Path == mock.PathChat {
			chats = append(chats, e)
		}
	}
	return chats
}

func hpdClear(t *testing.T, ms ...*Mock) {
	t.Helper()
	for _, m := range ms {
		res, err := http.Post("http://"+m.Addr+mock.PathRequestsClear, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
}

// hpdFaults flips a replica's failure rate through its HTTP fault knob.
func hpdFaults(t *testing.T, m *Mock, failRate float64) {
	t.Helper()
	res, err := http.Post("http://"+m.Addr+mock.PathFaults, "application/json",
		strings.NewReader(fmt.Sprintf(`{"fail_rate":%v}`, failRate)))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("%s faults: status %d", m.Name, res.StatusCode)
	}
}

// kvOf returns the raw kv_transfer_params of a logged body and the object.
func kvOf(t *testing.T, body json.RawMessage) (json.RawMessage, map[string]any) {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		t.Fatalf("logged body %s: %v", body, err)
	}
	raw := top["kv_transfer_params"]
	var kv map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &kv); err != nil {
			t.Fatalf("kv_transfer_params %s: %v", raw, err)
		}
	}
	return raw, kv
}

// hpdSSE is what a streamed chat completion delivered.
type hpdSSE struct {
	status  int
	header  http.Header
	content int  // events carrying delta content
	done    bool // data: [DONE] arrived
	usage   *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	raw string // the body when it was not an event stream
}

func (s *hpdStack) stream(t *testing.T, body io.Reader, hdr map[string]string) hpdSSE {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.H.URL+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = []string{v}
	}
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out := hpdSSE{status: res.StatusCode, header: res.Header}
	if !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(res.Body)
		out.raw = string(b)
		return out
	}
	ev, err := readChatEvents(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out.content, out.done = ev.content, ev.done
	if ev.usage != nil {
		_ = json.Unmarshal(ev.usage, &out.usage)
	}
	return out
}

// hpdChat is a PD request body built by hand, so the bytes the decode
// replica must receive (numbers as written, unicode, key order) are known.
func hpdChat(model, user string, maxTokens int, stream bool) []byte {
	system := strings.Repeat("You are the prefill/decode test assistant. ", 20)
	return fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"temperature":0.10,"top_p":1e0,"max_tokens":%d,"stream":%v,"stream_options":{"include_usage":true}}`,
		model, system, user, maxTokens, stream)
}

// TestHAProxyPD runs the prefill/decode checks that share one stack; the
// last one stops turnout.
func TestHAProxyPD(t *testing.T) { testHAProxyPD(t, "") }

// TestHAProxyPDSPOE: the same with HAProxy asking turnout over SPOE; the
// decode body is still rewritten by the Lua filter, from the agent's variables.
func TestHAProxyPDSPOE(t *testing.T) { testHAProxyPD(t, FreeAddr(t)) }

func testHAProxyPD(t *testing.T, spoeAddr string) {
	s := startHPD(t, spoeAddr)
	t.Run("StreamingChat", func(t *testing.T) { hpdStreaming(t, s, false) })
	t.Run("ChunkedUpload", func(t *testing.T) { hpdStreaming(t, s, true) })
	t.Run("PrefillRetried", func(t *testing.T) { hpdPrefillRetry(t, s) })
	t.Run("PrefillFailureRelayed", func(t *testing.T) { hpdPrefillFailure(t, s) })
	t.Run("ClientKVParamsRefused", func(t *testing.T) { hpdClientKV(t, s) })
	t.Run("NoPrefillRelayedWithRetryAfter", func(t *testing.T) { hpdNoPrefill(t, s) })
	t.Run("BodyTooLarge", func(t *testing.T) { hpdTooLarge(t, s) })
	t.Run("MixedUntouched", func(t *testing.T) { hpdMixed(t, s) })
	t.Run("OpenAINodeClient", func(t *testing.T) { hpdOpenAINode(t, s) })
	t.Run("DecodeReplicaAdded", func(t *testing.T) { hpdMembership(t, s) })
	t.Run("InflightBackToZero", func(t *testing.T) { hpdInflight(t, s) })
	t.Run("FailOpenAggregated", func(t *testing.T) { hpdFailOpen(t, s) })
}

// A streaming PD chat request: the whole SSE stream arrives, the prefill
// replica got the prefill request, the decode replica got the client's body
// with the prefill's kv_transfer_params inserted (byte for byte
// route.DecodeBody) and reports a valid transfer.
func hpdStreaming(t *testing.T, s *hpdStack, chunked bool) {
	hpdClear(t, s.pdMocks()...)
	body := hpdChat("pd", "日本語で答えて — \"quoted\" \\ 😀", 8, true)
	var rd io.Reader = bytes.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // no length: the client sends chunks
	}
	rid := fmt.Sprintf("pd-req-%v", chunked)
	got := s.stream(t, rd, map[string]string{"X-Session-ID": "pd-session", "X-Request-Id": rid})
	if got.status != 200 {
		t.Fatalf("status %d: %s", got.status, got.raw)
	}
	if got.content != 8 || !got.done || got.usage == nil || got.usage.CompletionTokens != 8 || got.usage.PromptTokens == 0 {
		t.Errorf("stream: %d content events (want 8), [DONE] %v, usage %+v", got.content, got.done, got.usage)
	}
	if v := got.header.Get(mock.HeaderKVTransfer); v != mock.KVTransferValid {
		t.Errorf("decode replica reports %s %q, want valid", mock.HeaderKVTransfer, v)
	}
	served := s.decodeByName(got.header.Get("X-Replica"))
	if served == nil {
		t.Fatalf("served by %q, not a decode replica", got.header.Get("X-Replica"))
	}

	// The prefill request, as the prefill replica saw it.
	var prefills []hpdLogged
	var prefiller *Mock
	for _, m := range s.prefill {
		if reqs := hpdRequests(t, m); len(reqs) > 0 {
			prefills, prefiller = append(prefills, reqs...), m
		}
	}
	if len(prefills) != 1 {
		t.Fatalf("prefill replicas saw %d chat requests, want 1", len(prefills))
	}
	var p map[string]any
	if err := json.Unmarshal(prefills[0].Body, &p); err != nil {
		t.Fatal(err)
	}
	_, pkv := kvOf(t, prefills[0].Body)
	if p["max_tokens"] != float64(1) || p["stream"] != false || p["stream_options"] != nil || pkv["do_remote_decode"] != true {
		t.Errorf("prefill body: max_tokens %v stream %v stream_options %v kv %v", p["max_tokens"], p["stream"], p["stream_options"], pkv)
	}
	if h := prefills[0].Headers; h["x-request-id"] != rid || h["x-session-id"] != "pd-session" {
		t.Errorf("prefill headers %v: want x-request-id %s and x-session-id pd-session", h, rid)
	}

	// The decode request: the client's body with the params inserted.
	dec := hpdRequests(t, served)
	if len(dec) != 1 {
		t.Fatalf("decode replica %s saw %d chat requests, want 1", served.Name, len(dec))
	}
	raw, kv := kvOf(t, dec[0].Body)
	want, err := route.DecodeBody(body, raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dec[0].Body, bytes.TrimSpace(want)) {
		t.Errorf("decode body is not route.DecodeBody(client body, kv):\n got %s\nwant %s", dec[0].Body, want)
	}
	if kv["do_remote_prefill"] != true || kv["remote_engine_id"] != prefiller.Name {
		t.Errorf("decode kv_transfer_params %v: want do_remote_prefill from engine %s", kv, prefiller.Name)
	}
	for _, m := range s.decode {
		if m != served && len(hpdRequests(t, m)) != 0 {
			t.Errorf("decode replica %s also got the request", m.Name)
		}
	}
}

// One prefill replica failing: turnout retries on the other; every request
// still decodes with valid params, all from the healthy prefill replica.
func hpdPrefillRetry(t *testing.T, s *hpdStack) {
	bad, good := s.prefill[0], s.prefill[1]
	hpdFaults(t, bad, 1)
	defer hpdFaults(t, bad, 0)
	hpdClear(t, s.decode...)
	failedBefore := bad.Stats().Failed
	for i := range 4 { // round-robin: the failing replica comes first in half of them
		r := s.post(t, hpdChat("pd", fmt.Sprintf("retry %d", i), 3, false), nil)
		if r.Status != 200 || r.Header.Get(mock.HeaderKVTransfer) != mock.KVTransferValid {
			t.Fatalf("request %d: status %d kv %q: %s", i, r.Status, r.Header.Get(mock.HeaderKVTransfer), r.Body)
		}
	}
	if bad.Stats().Failed == failedBefore {
		t.Fatalf("the failing prefill replica %s was never tried", bad.Name)
	}
	n := 0
	for _, m := range s.decode {
		for _, e := range hpdRequests(t, m) {
			n++
			if _, kv := kvOf(t, e.Body); kv["remote_engine_id"] != good.Name {
				t.Errorf("decode got params from %v, want %s", kv["remote_engine_id"], good.Name)
			}
		}
	}
	if n != 4 {
		t.Errorf("decode replicas saw %d requests, want 4", n)
	}
}

// Both prefill replicas failing: the client gets turnout's 502 as it is, and
// nothing reaches a decode replica (no fail-open to aggregated serving).
func hpdPrefillFailure(t *testing.T, s *hpdStack) {
	for _, m := range s.prefill {
		hpdFaults(t, m, 1)
	}
	defer func() {
		for _, m := range s.prefill {
			hpdFaults(t, m, 0)
		}
	}()
	var before int64
	for _, m := range s.decode {
		before += m.Stats().Requests
	}
	for i, stream := range []bool{true, false, true, false} { // past breaker_failures: turnout is alive
		r := s.post(t, hpdChat("pd", "doomed", 4, stream), nil)
		var e struct {
			Error struct{ Code, Type string } `json:"error"`
		}
		_ = json.Unmarshal(r.Body, &e)
		if r.Status != 502 || r.Header.Get("X-Turnout-Reason") != "prefill_failed" || e.Error.Code != "prefill_failed" || r.Header.Get("X-Replica") != "" {
			t.Fatalf("request %d: %d reason %q replica %q: %s", i, r.Status, r.Header.Get("X-Turnout-Reason"), r.Header.Get("X-Replica"), r.Body)
		}
	}
	var after int64
	for _, m := range s.decode {
		after += m.Stats().Requests
	}
	if after != before {
		t.Errorf("decode replicas got %d requests after failed prefills", after-before)
	}
}

func hpdClientKV(t *testing.T, s *hpdStack) {
	b := []byte(`{"model":"pd","messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"evil"}}`)
	r := s.post(t, b, nil)
	if r.Status != 400 || r.Header.Get("X-Turnout-Reason") != "kv_transfer_params_not_allowed" || !json.Valid(r.Body) || r.Header.Get("X-Replica") != "" {
		t.Errorf("client kv_transfer_params: %d %q %s", r.Status, r.Header.Get("X-Turnout-Reason"), r.Body)
	}
}

// A PD deployment with no_prefill reject and its prefill replica down:
// turnout's 503 reaches the client as it is, Retry-After included (the SPOE
// config relayed it without Retry-After before the contract carried it), and
// no decode replica is asked.
func hpdNoPrefill(t *testing.T, s *hpdStack) {
	var before int64
	for _, m := range s.decode {
		before += m.Stats().Requests
	}
	var r *Response
	Eventually(t, 10*time.Second, "the dead prefill replica to be marked down", func() bool {
		// Until the health check marks it down, the prefill is tried: 502.
		r = s.post(t, hpdChat("pdr", "x", 2, false), nil)
		return r.Status == 503
	})
	if r.Header.Get("X-Turnout-Reason") != contract.ReasonNoPrefillEndpoint || r.Header.Get("Retry-After") != contract.RetryAfterSeconds || !json.Valid(r.Body) || r.Header.Get("X-Replica") != "" {
		t.Errorf("no prefill: %d reason %q retry-after %q replica %q: %s", r.Status, r.Header.Get("X-Turnout-Reason"), r.Header.Get("Retry-After"), r.Header.Get("X-Replica"), r.Body)
	}
	var after int64
	for _, m := range s.decode {
		after += m.Stats().Requests
	}
	if after != before {
		t.Errorf("decode replicas got %d requests for refused pdr requests", after-before)
	}
}

// A PD body over max_body: turnout's 413 reaches the client at once, with
// Content-Length and chunked alike, and no replica is involved.
func hpdTooLarge(t *testing.T, s *hpdStack) {
	big := hpdChat("pd", strings.Repeat("x", 3*hpdMaxBody), 4, true)
	var before int64
	for _, m := range s.pdMocks() {
		before += m.Stats().Requests
	}
	for _, chunked := range []bool{false, true} {
		start := time.Now()
		res, b, err := postEarlyAnswer(s.H.URL, "/v1/chat/completions", big, chunked)
		if err != nil {
			t.Fatalf("chunked=%v: %v", chunked, err)
		}
		if res.StatusCode != 413 || res.Header.Get("X-Turnout-Reason") != "body_too_large" || !json.Valid(b) || res.Header.Get("X-Replica") != "" {
			t.Errorf("chunked=%v: %d reason %q: %s", chunked, res.StatusCode, res.Header.Get("X-Turnout-Reason"), b)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("chunked=%v: 413 took %v", chunked, d)
		}
	}
	var after int64
	for _, m := range s.pdMocks() {
		after += m.Stats().Requests
	}
	if after != before {
		t.Errorf("replicas got %d requests for oversized bodies", after-before)
	}
}

// A mixed deployment next to PD keeps its body byte for byte.
func hpdMixed(t *testing.T, s *hpdStack) {
	m := s.mixed[0]
	hpdClear(t, m)
	body := hpdChat("chat", "plain", 3, false)
	r := s.post(t, body, nil)
	if r.Status != 200 || r.Header.Get("X-Replica") != m.Name {
		t.Fatalf("status %d replica %q: %s", r.Status, r.Header.Get("X-Replica"), r.Body)
	}
	got := hpdRequests(t, m)
	if len(got) != 1 || !bytes.Equal(got[0].Body, body) {
		t.Errorf("mixed replica got %d requests, body %s", len(got), got)
	}
}

// The openai npm client streams through the PD deployment (the shared test
// asks for model "llama", which is served by "pd" here), and its requests
// were disaggregated.
func hpdOpenAINode(t *testing.T, s *hpdStack) {
	hpdClear(t, s.pdMocks()...)
	checkOpenAINode(t, s.H.URL, "llama")
	var prefills, decodes int
	for _, m := range s.prefill {
		prefills += len(hpdRequests(t, m))
	}
	for _, m := range s.decode {
		for _, e := range hpdRequests(t, m) {
			decodes++
			if _, kv := kvOf(t, e.Body); kv["do_remote_prefill"] != true {
				t.Errorf("decode request without transfer params: %s", e.Body)
			}
		}
	}
	if prefills != 1 || decodes != 1 {
		t.Errorf("openai client: %d prefill and %d decode requests, want 1 and 1", prefills, decodes)
	}
}

// A decode replica added through the config joins the filtered backend over
// the runtime API (no reload) and serves PD requests with valid params.
func hpdMembership(t *testing.T, s *hpdStack) {
	pid := s.H.Info(t)["Pid"]
	added := StartMock(t, fmt.Sprintf("dec-%d", len(s.decode)), func(c *mock.Config) { c.Role, c.Models = mock.RoleDecode, []string{"pd", "llama"} })
	s.decode = append(s.decode, added)
	s.T.Rewrite(t, s.yaml())
	s.H.WaitServersUp(t, "pd_decode/"+added.Name)
	served := false
	for i := 0; i < 30 && !served; i++ { // round-robin reaches it within a few requests
		r := s.post(t, hpdChat("pd", fmt.Sprintf("new replica %d", i), 2, false), nil)
		if r.Status != 200 || r.Header.Get(mock.HeaderKVTransfer) != mock.KVTransferValid {
			t.Fatalf("request %d: status %d kv %q: %s", i, r.Status, r.Header.Get(mock.HeaderKVTransfer), r.Body)
		}
		served = r.Header.Get("X-Replica") == added.Name
	}
	if !served {
		t.Errorf("the added decode replica %s never served", added.Name)
	}
	if got := s.H.Info(t)["Pid"]; got != pid {
		t.Errorf("HAProxy worker pid %s -> %s: adding a decode replica caused a reload", pid, got)
	}
}

// PD decisions are closed through the syslog feedback like any other.
func hpdInflight(t *testing.T, s *hpdStack) {
	Eventually(t, 10*time.Second, "turnout_endpoint_inflight to return to 0", func() bool {
		v, err := Metric(t, s.T.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	})
}

// turnout down, fail-open: the PD deployment is served aggregated by a
// decode replica (no params, so it computes the prefill itself), streaming.
func hpdFailOpen(t *testing.T, s *hpdStack) {
	s.T.Stop()
	hpdClear(t, s.prefill...)
	for i := range 8 { // past the breaker on each HAProxy thread
		got := s.stream(t, bytes.NewReader(hpdChat("pd", fmt.Sprintf("no turnout %d", i), 4, true)), nil)
		if got.status != 200 || got.content != 4 || !got.done {
			t.Fatalf("request %d: status %d, %d content events, [DONE] %v: %s", i, got.status, got.content, got.done, got.raw)
		}
		if s.decodeByName(got.header.Get("X-Replica")) == nil || got.header.Get(mock.HeaderKVTransfer) != mock.KVTransferNone {
			t.Fatalf("request %d: replica %q kv %q, want a decode replica computing alone", i, got.header.Get("X-Replica"), got.header.Get(mock.HeaderKVTransfer))
		}
	}
	for _, m := range s.prefill {
		if n := len(hpdRequests(t, m)); n != 0 {
			t.Errorf("prefill replica %s got %d requests without turnout", m.Name, n)
		}
	}
}

// postEarlyAnswer posts body (chunked or with a length) and reads the
// answer while the body is still going out: a proxy that refuses a body
// answers and closes before reading it all, and net/http's client can
// then report its own write error ("broken pipe": once in CI) rather than
// the answer. RFC 7230 §6.5: a client sending a body should watch for an
// early answer.
func postEarlyAnswer(base, path string, body []byte, chunked bool) (*http.Response, []byte, error) {
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 2*time.Second)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	go func() { // write errors are expected once the proxy has answered
		w := bufio.NewWriter(c)
		fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: turnout-test\r\nContent-Type: application/json\r\n", path)
		if chunked {
			w.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			for rest := body; len(rest) > 0; {
				n := min(len(rest), 16<<10)
				fmt.Fprintf(w, "%x\r\n", n)
				w.Write(rest[:n])
				w.WriteString("\r\n")
				rest = rest[n:]
			}
			w.WriteString("0\r\n\r\n")
		} else {
			fmt.Fprintf(w, "Content-Length: %d\r\n\r\n", len(body))
			w.Write(body)
		}
		w.Flush()
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	return res, b, err
}
