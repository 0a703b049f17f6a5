//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// The soak's traffic (issue 42 "with all of the above on"): besides the
// tenants' own streams and short answers, clients that claim a priority
// and invent tenants, adapters by name (one listed for load_on_demand, the
// rest made up), duplicate "model" keys past route_body and the engines'
// admin routes. Each kind has its own expected answer.

type soakKind int

const (
	kindChat      soakKind = iota // model llama, a tenant named by its API key
	kindAttacker                  // x-priority: critical, a new tenant header and key per request
	kindAdapter                   // od-1: listed in lora.allow, loaded on demand
	kindMadeUp                    // od-evil-N: matches lora.adapters, listed nowhere
	kindDupLast                   // {"model":"nope",...60 KB...,"model":"llama"}
	kindDupMadeUp                 // {"model":"llama",...60 KB...,"model":"od-evil-N"}
	kindAdmin                     // an engine admin route (load_lora_adapter, /sleep, ...)
	nKinds
)

var kindNames = [nKinds]string{
	"tenant chat (API key)", "attacker (critical, invented tenant)", "adapter od-1 (listed)",
	"made-up adapter", "dup model, last llama", "dup model, last made-up", "admin route",
}

// soakTenantKeys are the keys the config names (tenant_keys).
var soakTenantKeys = map[string]string{"Bearer soak-team-a": "team-a", "Bearer soak-team-b": "team-b"}

// soakDepYAML turns on issue 42's defences in the soak's deployment, as
// docs/flow-control.md and docs/models.md configure them: flow control
// with the client's priority and tenant headers untrusted (no proxy in
// front sets them) and tenants named by API key; adapters loaded on demand
// only from an explicit list.
func soakDepYAML() []string {
	var keys []string
	for k, name := range soakTenantKeys {
		h := sha256.Sum256([]byte(k))
		keys = append(keys, hex.EncodeToString(h[:])+": "+name)
	}
	slices.Sort(keys)
	return []string{
		"flow_control:",
		"  trust: {priority_header: false, tenant_header: false}",
		"  tenant_api_key: true",
		"  tenant_keys: {" + strings.Join(keys, ", ") + "}",
		"  saturation: {max_load: 2}",
		`lora: {load_on_demand: true, adapters: ["od-*"], allow: [od-1], load_timeout: 2s}`,
	}
}

// soakAdminPaths are the engines' admin routes the proxies refuse.
var soakAdminPaths = []string{
	"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/LOAD_LORA_ADAPTER?x=1",
	"/reset_prefix_cache", "/sleep?level=1", "/wake_up", "/start_profile",
}

// soakQuery is one request of the soak.
type soakQuery struct {
	kind   soakKind
	id     string // X-Request-Id, also the prompt
	path   string
	body   []byte
	stream bool
	hdr    map[string]string
}

// soakWorkers is how many closed-loop clients each stack has: 6 tenants'
// chats, 2 attackers, 1 cycling through the other kinds.
const soakWorkers = 9

// soakNext is worker w's i-th request.
func soakNext(w, i int) soakQuery {
	id := fmt.Sprintf("w%d-%d", w, i)
	q := soakQuery{id: id, path: "/v1/chat/completions", kind: kindChat}
	switch {
	case w < 6:
		q.stream = i%2 == 0
		q.hdr = map[string]string{"Authorization": "Bearer soak-team-a"}
		if w >= 3 {
			q.hdr["Authorization"] = "Bearer soak-team-b"
		}
		q.body = soakChat("llama", id, q.stream)
	case w < 8:
		q.kind, q.stream = kindAttacker, true
		q.hdr = map[string]string{"X-Priority": "critical", "X-Tenant-Id": "evil-" + id, "Authorization": "Bearer evil-" + id}
		q.body = soakChat("llama", id, true)
	default:
		q.kind = []soakKind{kindAdapter, kindMadeUp, kindAdapter, kindDupLast, kindAdmin, kindDupMadeUp}[i%6]
		switch q.kind {
		case kindAdapter:
			q.stream = i%12 == 0
			q.body = soakChat("od-1", id, q.stream)
		case kindMadeUp:
			q.body = soakChat("od-evil-"+id, id, false)
		case kindDupLast:
			q.body = dupBody("nope", "llama")
		case kindDupMadeUp:
			q.body = dupBody("llama", "od-evil-"+id)
		case kindAdmin:
			q.path = soakAdminPaths[(i/6)%len(soakAdminPaths)]
			q.body = []byte(`{"lora_name":"evil-admin","lora_path":"/tmp/evil-admin"}`)
		}
	}
	return q
}

func soakChat(model, user string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model, "messages": []map[string]string{{"role": "user", "content": user}},
		"max_tokens": 20, "stream": stream,
	})
	return b
}

// soakResult is one request's outcome: the replica that answered (from
// its X-Replica header), why it failed, or which expected refusal it got.
type soakResult struct {
	kind          soakKind
	id            string
	start         time.Time
	ttfb          time.Duration // to the response headers; -1 without
	ok            bool
	note          string // an expected answer other than 200 (a refusal, a fail-open answer)
	retries       int    // 503 Retry-After answers retried, as the openai SDKs do
	replica       string
	cause, detail string
}

// soakDo sends q (again after a 503 with Retry-After, at most twice, as
// the openai SDKs do) and judges the answer by q's kind.
func soakDo(c *http.Client, base string, q soakQuery) soakResult {
	r := soakResult{kind: q.kind, id: q.id, start: time.Now(), ttfb: -1}
	for {
		st, hdr, body, complete, err := soakSend(c, base, q, &r)
		if err != nil {
			r.cause, r.detail = "no response (transport error)", err.Error()
			return r
		}
		r.replica = hdr.Get(mock.HeaderReplica)
		if st == http.StatusServiceUnavailable && hdr.Get("Retry-After") != "" && r.retries < 2 && q.kind != kindAdmin {
			r.retries++
			wait, _ := strconv.Atoi(hdr.Get("Retry-After"))
			time.Sleep(min(time.Duration(wait)*time.Second, 2*time.Second))
			continue
		}
		soakJudge(&r, q, st, body, complete)
		return r
	}
}

// soakSend is one exchange: the status, headers, the body read (up to 1
// KiB for an error) and whether it ended well (a stream with [DONE]).
func soakSend(c *http.Client, base string, q soakQuery, r *soakResult) (int, http.Header, []byte, bool, error) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+q.path, bytes.NewReader(q.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", q.id)
	// As the openai SDKs do: a POST written into a keep-alive connection
	// the proxy closed at that moment (an nginx reload closes idle ones)
	// was never read; the key lets Go's transport send it again.
	req.Header.Set("Idempotency-Key", q.id)
	for k, v := range q.hdr {
		req.Header.Set(k, v)
	}
	sent := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, false, err
	}
	defer res.Body.Close()
	if r.ttfb < 0 {
		r.ttfb = time.Since(sent)
	}
	if res.StatusCode != 200 || !q.stream {
		b, err := io.ReadAll(res.Body)
		if err != nil {
			r.detail = err.Error()
		}
		return res.StatusCode, res.Header, b[:min(len(b), 1024)], err == nil, nil
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "[DONE]") {
			return res.StatusCode, res.Header, nil, true, nil
		}
	}
	r.detail = fmt.Sprint(sc.Err())
	return res.StatusCode, res.Header, nil, false, nil
}

func soakJudge(r *soakResult, q soakQuery, st int, body []byte, complete bool) {
	switch q.kind {
	case kindAdmin:
		// The proxies' own 404, whatever turnout is doing.
		if st == 404 && r.replica == "" {
			r.ok, r.note = true, "404 from the proxy"
			return
		}
		r.cause, r.detail = fmt.Sprintf("admin route %s answered %d", q.path, st), fmt.Sprintf("%.200s", body)
		return
	case kindMadeUp, kindDupMadeUp:
		// turnout's 404 (the last "model" read); a replica's answer only
		// while the proxy fails open (turnout restarting or stopped).
		switch {
		case st == 404 && r.replica == "" && bytes.Contains(body, []byte("model_not_found")):
			r.ok, r.note = true, "404 model_not_found from turnout"
		case st == 200 && r.replica != "" && complete:
			r.ok, r.note = true, "served by a replica (the proxy failing open)"
		default:
			r.cause, r.detail = fmt.Sprintf("made-up name answered %d", st), fmt.Sprintf("%.200s", body)
		}
		return
	}
	switch {
	case st != 200:
		r.cause, r.detail = fmt.Sprintf("status %d before any byte", st), fmt.Sprintf("%.200s", body)
		if bytes.Contains(body, []byte("shutting down")) {
			r.cause += " (a dying replica refused it)"
		}
		if q.kind == kindAdapter && st == 404 {
			r.cause += " (a listed adapter)"
		}
	case !complete && q.stream:
		r.cause = "stream cut"
	case !complete:
		r.cause = "short answer cut"
	default:
		r.ok = true
		if r.retries > 0 {
			r.note = "200 after 503 Retry-After"
		}
	}
}
