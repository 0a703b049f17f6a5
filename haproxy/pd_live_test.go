package haproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// Live prefill/decode tests: the rendered Lua action and kv filter in a real
// HAProxy, a fake turnout answering PD verdicts, and replicas that record the
// body they received. The reference for every rewritten body is
// route.DecodeBody.

const pdDecision = "00000000000000d1"

// pdVerdict answers like turnout for a PD deployment: the decode verdict,
// plus the body edit (contract.BodyEdit of the body
// it was sent) when kv is not empty.
func pdVerdict(server, kv string) func(w http.ResponseWriter, c routeCall) {
	return func(w http.ResponseWriter, c routeCall) {
		h := w.Header()
		h.Set(contract.HdrServer, server)
		h.Set(contract.HdrPool, "m_decode")
		h.Set(contract.HdrDecision, pdDecision)
		h.Set(contract.HdrPrefill, "p0")
		if kv != "" {
			ins, at := contract.BodyEdit(c.body, []byte(kv), nil)
			h.Set(contract.HdrKVInsert, base64.StdEncoding.EncodeToString(ins))
			h.Set(contract.HdrKVAt, strconv.Itoa(at))
		}
		w.WriteHeader(http.StatusOK)
	}
}

// startPDLive runs HAProxy for a PD deployment: prefill p0 (never used for
// client traffic), decode dec (default: plain replicas d0 and d1).
func startPDLive(t *testing.T, fr *fakeRoute, syslog string, dec ...*replica) (*liveEnv, []*replica) {
	return startPDLiveOpts(t, fr, liveOpts{syslog: syslog}, dec...)
}

func startPDLiveOpts(t *testing.T, fr *fakeRoute, o liveOpts, dec ...*replica) (*liveEnv, []*replica) {
	t.Helper()
	if len(dec) == 0 {
		dec = []*replica{newReplica(t, "d0"), newReplica(t, "d1")}
	}
	o.routeURL = fr.srv.Listener.Addr().String()
	o.replicas = dec
	o.prefill = []*replica{newReplica(t, "p0")}
	e := startLive(t, o)
	return e, dec
}

// postBody sends body as is, with Content-Length or chunked.
func (e *liveEnv) postBody(t *testing.T, body []byte, chunked bool, hdr map[string]string) answer {
	t.Helper()
	var rd io.Reader = bytes.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // hides the length: the client sends chunks
	}
	req, err := http.NewRequest(http.MethodPost, e.url+"/v1/chat/completions", rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = []string{v}
	}
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: string(b), dur: time.Since(start)}
}

func (r *replica) received() ([]byte, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastBody, r.lastCL
}

// blockIDs is a kv_transfer_params object with n block ids.
func blockIDs(n int) string {
	var b strings.Builder
	b.WriteString(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"eng-p0","remote_block_ids":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, 100000+i)
	}
	b.WriteString(`],"remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}`)
	return b.String()
}

// TestLivePDBodyInjection: the decode replica receives exactly
// route.DecodeBody(body, kv), framed by a correct Content-Length, for every
// body shape, kv shape, and for chunked uploads.
func TestLivePDBodyInjection(t *testing.T) {
	fr := newFakeRoute(t)
	e, dec := startPDLive(t, fr, "")

	typical := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"eng-p0","remote_block_ids":[1,2,3],"remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}`
	bodies := []string{
		`{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`  {"model":"m1","prompt":"leading spaces"}`,
		"\t\r\n{\"model\":\"m1\"}\n",
		`{}`,
		` { } `,
		"{\n}",
		`{"model":"m1","messages":[{"role":"user","content":"日本語 é \"q\" \\ \u00e9 😀 {not a brace}"}],"temperature":0.10,"n":1e3,"x":-0,"ok":[true,null]}`,
		`{"model":"m1","prompt":"` + strings.Repeat("long prompt ", 300) + `"}`,
		`{"model":"m1","nested":{"a":{"b":[{},{"c":"}"}]}},"max_tokens":7}`,
	}
	kvs := []string{
		typical,
		`{}`,
		`{"remote_engine_id":"é \"quoted\" \\ 😀","remote_block_ids":[]}`,
		blockIDs(1000), // ~7 KB: a long prompt's block ids
	}
	check := func(t *testing.T, body, kv string, chunked bool) {
		t.Helper()
		fr.set(pdVerdict("d1", kv))
		a := e.postBody(t, []byte(body), chunked, nil)
		if a.status != 200 || a.header.Get("X-Replica") != "d1" {
			t.Fatalf("status %d replica %q: %s", a.status, a.header.Get("X-Replica"), a.body)
		}
		want, err := route.DecodeBody([]byte(body), []byte(kv))
		if err != nil {
			t.Fatal(err)
		}
		got, cl := dec[1].received()
		if !bytes.Equal(got, want) {
			t.Fatalf("decode body differs from route.DecodeBody:\n got %q\nwant %q", got, want)
		}
		if cl != int64(len(want)) {
			t.Errorf("Content-Length %d, want %d (the body length)", cl, len(want))
		}
		if !json.Valid(got) {
			t.Errorf("decode body is not valid JSON: %q", got)
		}
	}
	for i, body := range bodies {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("body%d/chunked=%v", i, chunked), func(t *testing.T) { check(t, body, typical, chunked) })
		}
	}
	for i, kv := range kvs {
		t.Run(fmt.Sprintf("kv%d", i), func(t *testing.T) { check(t, bodies[0], kv, false) })
	}

	// The body the fake turnout saw is the client's, not the rewritten one.
	if c := fr.lastCall(); !bytes.Equal(c.body, []byte(bodies[0])) {
		t.Errorf("turnout got %q", c.body)
	}

	t.Run("NoKVPassesUntouched", func(t *testing.T) {
		// A verdict without kv (skipped prefill) goes to the same filtered
		// backend and must leave the body alone.
		fr.set(pdVerdict("d0", ""))
		body := bodies[6]
		for _, chunked := range []bool{false, true} {
			if a := e.postBody(t, []byte(body), chunked, nil); a.status != 200 || a.header.Get("X-Replica") != "d0" {
				t.Fatalf("status %d replica %q", a.status, a.header.Get("X-Replica"))
			}
			if got, _ := dec[0].received(); string(got) != body {
				t.Fatalf("chunked=%v: body changed without kv: %q", chunked, got)
			}
		}
	})
	t.Run("BadKVFailsOpenUntouched", func(t *testing.T) {
		// An answer the Lua cannot use fails as a whole (fail-open here):
		// no half-applied verdict, no kv, no Content-Length change.
		fr.set(func(w http.ResponseWriter, _ routeCall) {
			w.Header().Set(contract.HdrServer, "d0")
			w.Header().Set(contract.HdrPool, "m_decode")
			w.Header().Set(contract.HdrKVInsert, "not base64 at all!")
			w.Header().Set(contract.HdrKVAt, "1")
		})
		a := e.postBody(t, []byte(bodies[0]), false, nil)
		served := map[string]*replica{"d0": dec[0], "d1": dec[1]}[a.header.Get("X-Replica")]
		if a.status != 200 || served == nil {
			t.Fatalf("status %d replica %q: %s", a.status, a.header.Get("X-Replica"), a.body)
		}
		if got, _ := served.received(); string(got) != bodies[0] {
			t.Errorf("%s got %q from an unusable answer", served.name, got)
		}
	})
	t.Run("CredentialsReachTurnout", func(t *testing.T) {
		// turnout sends the prefill itself and needs the client's API key.
		fr.set(pdVerdict("d0", typical))
		e.postBody(t, []byte(bodies[0]), false, map[string]string{"Authorization": "Bearer k-1"})
		if got := fr.lastCall().header.Get("Authorization"); got != "Bearer k-1" {
			t.Errorf("Authorization to turnout = %q", got)
		}
	})
}

// TestLivePDRetryReplaysRewrittenBody: the chosen decode replica drops the
// connection without answering; with haproxy.l7_retries HAProxy's L7 retry
// (empty-response) sends the other replica the rewritten body, with the
// params inserted once.
func TestLivePDRetryReplaysRewrittenBody(t *testing.T) {
	fr := newFakeRoute(t)
	// d0 passes health checks but hangs up on every request.
	rude := &replica{name: "d0"}
	rude.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/health" {
			return
		}
		rude.hits.Add(1)
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = c.Close()
		}
	}))
	t.Cleanup(rude.srv.Close)
	e, dec := startPDLiveOpts(t, fr, liveOpts{l7Retries: true}, rude, newReplica(t, "d1"))
	kv := `{"do_remote_prefill":true,"remote_block_ids":[7,8],"remote_engine_id":"eng-p0","remote_host":"10.0.0.1","remote_port":5600}`
	fr.set(pdVerdict("d0", kv))
	body := `{"model":"m1","messages":[{"role":"user","content":"retry me"}]}`
	a := e.postBody(t, []byte(body), false, nil)
	if a.status != 200 || a.header.Get("X-Replica") != "d1" || dec[0].hits.Load() == 0 {
		t.Fatalf("status %d replica %q (d0 tried %d times), want d1 after a retry", a.status, a.header.Get("X-Replica"), dec[0].hits.Load())
	}
	want, _ := route.DecodeBody([]byte(body), []byte(kv))
	if got, _ := dec[1].received(); !bytes.Equal(got, want) {
		t.Errorf("retried body:\n got %q\nwant %q", got, want)
	}
}

// TestLivePDRefusals: turnout's PD errors reach the client as they are, a
// decode body too large for the buffer is a clean 413 (and still closes the
// decision through the log line), other 5xx keep failing open.
func TestLivePDRefusals(t *testing.T) {
	fr := newFakeRoute(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	e, dec := startPDLive(t, fr, pc.LocalAddr().String())
	hits := func() int64 { return dec[0].hits.Load() + dec[1].hits.Load() }
	body := []byte(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)

	t.Run("PrefillFailedRelayed", func(t *testing.T) {
		const errBody = `{"error":{"message":"prefill failed on every tried replica","type":"server_error","code":"prefill_failed"}}`
		fr.set(func(w http.ResponseWriter, _ routeCall) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(contract.HdrReason, "prefill_failed")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, errBody)
		})
		before := hits()
		for i := range 5 { // more than breaker_failures: a relayed answer is no failure
			a := e.postBody(t, body, false, nil)
			if a.status != 502 || a.header.Get(contract.HdrReason) != "prefill_failed" || a.body != errBody {
				t.Fatalf("request %d: %d %q %s", i, a.status, a.header.Get(contract.HdrReason), a.body)
			}
		}
		if hits() != before {
			t.Error("a failed prefill reached a decode replica")
		}
	})
	t.Run("OtherReasonsFailOpen", func(t *testing.T) {
		fr.set(func(w http.ResponseWriter, _ routeCall) {
			w.Header().Set(contract.HdrReason, "no_endpoint")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		if a := e.postBody(t, body, false, nil); a.status != 200 || a.header.Get("X-Replica") == "" {
			t.Fatalf("no_endpoint: %d %q, want fail-open to a decode replica", a.status, a.header.Get("X-Replica"))
		}
	})

	room := bufSize(4096+kvRoom(4096)) - headerRoom // the live config's max_body is 4096
	tooLarge := func(t *testing.T, a answer) {
		t.Helper()
		if a.status != 413 || a.header.Get(contract.HdrReason) != "decode_body_too_large" || !json.Valid([]byte(a.body)) {
			t.Fatalf("%d %q %s", a.status, a.header.Get(contract.HdrReason), a.body)
		}
		if a.dur > 2*time.Second {
			t.Errorf("413 took %v", a.dur)
		}
	}
	t.Run("DecodeBodyOverRoom", func(t *testing.T) {
		fr.set(pdVerdict("d0", blockIDs(room/7)))
		before := hits()
		tooLarge(t, e.postBody(t, body, false, nil))
		if hits() != before {
			t.Error("an oversized decode body reached a replica")
		}
		// The log line carries the decision, so turnout closes it.
		_ = pc.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 4096)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				t.Fatalf("no feedback line with id=%s status=413: %v", pdDecision, err)
			}
			if line := string(buf[:n]); strings.Contains(line, "id="+pdDecision) && strings.Contains(line, "status=413") {
				break
			}
		}
	})
	t.Run("FilterOutOfRoom", func(t *testing.T) {
		// Body and kv fit BODY_ROOM, but huge headers leave the buffer
		// without room for the insertion: the filter answers 413 itself.
		kv := blockIDs((room - len(body) - 200) / 7)
		fr.set(pdVerdict("d0", kv))
		a := e.postBody(t, body, false, map[string]string{"X-Pad": strings.Repeat("p", 17<<10)})
		tooLarge(t, a)
	})
}
