package mock

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func startServer(t *testing.T, mutate func(*Config)) (*Server, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Name = "r1"
	cfg.TimeScale = 0
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, base
}

func do(t *testing.T, method, u, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, b
}

func post(t *testing.T, u, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	return do(t, http.MethodPost, u, body, hdr...)
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type choiceJSON struct {
	Index   int `json:"index"`
	Message *struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Role    *string `json:"role"`
		Content *string `json:"content"`
	} `json:"delta"`
	Text         *string `json:"text"`
	FinishReason *string `json:"finish_reason"`
}

type respJSON struct {
	ID               string          `json:"id"`
	Object           string          `json:"object"`
	Created          int64           `json:"created"`
	Model            string          `json:"model"`
	Choices          []choiceJSON    `json:"choices"`
	Usage            *usageJSON      `json:"usage"`
	KVTransferParams *kvTransferJSON `json:"kv_transfer_params"`
}

type kvTransferJSON struct {
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteBlockIDs  []int64 `json:"remote_block_ids"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
}

type errJSON struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

func words(n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = "w" + strconv.Itoa(i)
	}
	return strings.Join(w, " ")
}

func chatBody(content string, extra string) string {
	b, _ := json.Marshal(content)
	return `{"model":"llama","messages":[{"role":"user","content":` + string(b) + `}]` + extra + `}`
}

type sseEvent struct {
	data string
	at   time.Duration // since start
}

// readSSE parses a stream strictly ("data: X\n\n" events). It returns the
// events before [DONE], whether [DONE] was seen, and any read error (a died
// stream ends in io.ErrUnexpectedEOF).
func readSSE(t *testing.T, body io.Reader, start time.Time) ([]sseEvent, bool, error) {
	t.Helper()
	br := bufio.NewReader(body)
	var evs []sseEvent
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" {
				return evs, false, nil
			}
			return evs, false, err
		}
		at := time.Since(start)
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("bad SSE line %q", line)
		}
		blank, err := br.ReadString('\n')
		if err != nil {
			return evs, false, err
		}
		if blank != "\n" {
			t.Fatalf("event not followed by a blank line: %q", blank)
		}
		data := strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n")
		if data == "[DONE]" {
			if rest, _ := io.ReadAll(br); len(rest) != 0 {
				t.Fatalf("data after [DONE]: %q", rest)
			}
			return evs, true, nil
		}
		evs = append(evs, sseEvent{data: data, at: at})
	}
}

func stream(t *testing.T, u, body string) ([]respJSON, []sseEvent, bool, error, *http.Response) {
	t.Helper()
	start := time.Now()
	resp, err := http.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content-type %q", ct)
	}
	evs, done, rerr := readSSE(t, resp.Body, start)
	chunks := make([]respJSON, len(evs))
	for i, e := range evs {
		chunks[i] = decode[respJSON](t, []byte(e.data))
	}
	return chunks, evs, done, rerr, resp
}

func TestChatNonStreamingAndCachedTokens(t *testing.T) {
	_, base := startServer(t, func(c *Config) { c.MaxTokensDefault = 5 })
	body := chatBody(words(40), "") // 1 role token + 40 words = 41 tokens, 2 full blocks
	for i, wantCached := range []int{0, 32} {
		resp, b := post(t, base+PathChat, body)
		if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != "r1" {
			t.Fatalf("status %d replica %q: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), b)
		}
		if resp.Header.Get(HeaderKVTransfer) != "" {
			t.Fatal("mixed role must not set X-KV-Transfer")
		}
		r := decode[respJSON](t, b)
		if r.Object != "chat.completion" || r.Model != "llama" || !strings.HasPrefix(r.ID, "chatcmpl-") || r.Created == 0 {
			t.Fatalf("header fields: %+v", r)
		}
		if len(r.Choices) != 1 || r.Choices[0].Message == nil || r.Choices[0].Message.Role != "assistant" ||
			r.Choices[0].Message.Content != "tok1 tok2 tok3 tok4 tok5" || *r.Choices[0].FinishReason != "length" {
			t.Fatalf("choices: %s", b)
		}
		u := r.Usage
		if u == nil || u.PromptTokens != 41 || u.CompletionTokens != 5 || u.TotalTokens != 46 || u.PromptTokensDetails.CachedTokens != wantCached {
			t.Fatalf("request %d usage: %s", i, b)
		}
	}
	// max_completion_tokens wins over max_tokens.
	_, b := post(t, base+PathChat, chatBody("x", `,"max_tokens":9,"max_completion_tokens":2`))
	if r := decode[respJSON](t, b); r.Usage.CompletionTokens != 2 || r.Choices[0].Message.Content != "tok1 tok2" {
		t.Fatalf("max_completion_tokens: %s", b)
	}
}

func TestCompletionsNonStreamingBatch(t *testing.T) {
	_, base := startServer(t, nil)
	_, b := post(t, base+PathCompletions, `{"model":"llama","prompt":["a b c","d e"],"max_tokens":3}`)
	r := decode[respJSON](t, b)
	if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || len(r.Choices) != 2 {
		t.Fatalf("response: %s", b)
	}
	for i, c := range r.Choices {
		if c.Index != i || c.Text == nil || *c.Text != "tok1 tok2 tok3" {
			t.Fatalf("choice %d: %s", i, b)
		}
	}
	if r.Usage.PromptTokens != 5 || r.Usage.CompletionTokens != 6 || r.Usage.TotalTokens != 11 {
		t.Fatalf("usage: %s", b)
	}
}

func TestStreamingFormat(t *testing.T) {
	_, base := startServer(t, nil)
	for _, tc := range []struct {
		name  string
		url   string
		body  string
		usage bool
	}{
		{"chat", PathChat, chatBody(words(20), `,"stream":true,"max_tokens":4`), false},
		{"chat with usage", PathChat, chatBody(words(20), `,"stream":true,"max_tokens":4,"stream_options":{"include_usage":true}`), true},
		{"completions with usage", PathCompletions, `{"prompt":"` + words(20) + `","stream":true,"max_tokens":4,"stream_options":{"include_usage":true}}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunks, _, done, err, resp := stream(t, base+tc.url, tc.body)
			if err != nil || !done {
				t.Fatalf("done=%v err=%v", done, err)
			}
			if resp.Header.Get(HeaderReplica) != "r1" {
				t.Fatal("missing X-Replica on stream")
			}
			chat := tc.url == PathChat
			if chat {
				// vLLM's first chunk carries the role only.
				first := chunks[0]
				if first.Object != "chat.completion.chunk" || first.Choices[0].Delta == nil || first.Choices[0].Delta.Role == nil ||
					*first.Choices[0].Delta.Role != "assistant" {
					t.Fatalf("role chunk: %+v", first)
				}
				chunks = chunks[1:]
			}
			var text strings.Builder
			id := chunks[0].ID
			for i := 0; i < 4; i++ {
				c := chunks[i]
				if c.ID != id || len(c.Choices) != 1 || c.Usage != nil {
					t.Fatalf("chunk %d: %+v", i, c)
				}
				if chat {
					text.WriteString(*c.Choices[0].Delta.Content)
				} else {
					if c.Object != "text_completion" {
						t.Fatalf("object %q", c.Object)
					}
					text.WriteString(*c.Choices[0].Text)
				}
				fr := c.Choices[0].FinishReason
				if (i == 3) != (fr != nil && *fr == "length") {
					t.Fatalf("chunk %d finish_reason %v", i, fr)
				}
			}
			if text.String() != "tok1 tok2 tok3 tok4" {
				t.Fatalf("streamed text %q", text.String())
			}
			rest := chunks[4:]
			if !tc.usage {
				if len(rest) != 0 {
					t.Fatalf("unexpected extra chunks %+v", rest)
				}
				return
			}
			if len(rest) != 1 || len(rest[0].Choices) != 0 || rest[0].Usage == nil {
				t.Fatalf("usage chunk: %+v", rest)
			}
			wantPrompt := 20
			if chat {
				wantPrompt = 21
			}
			if u := rest[0].Usage; u.PromptTokens != wantPrompt || u.CompletionTokens != 4 || u.TotalTokens != wantPrompt+4 {
				t.Fatalf("usage %+v", u)
			}
		})
	}
}

func TestStreamingBatchInterleavesChoices(t *testing.T) {
	_, base := startServer(t, nil)
	chunks, _, done, err, _ := stream(t, base+PathCompletions, `{"prompt":[[1,2],[3]],"stream":true,"max_tokens":2}`)
	if err != nil || !done || len(chunks) != 4 {
		t.Fatalf("done=%v err=%v chunks=%d", done, err, len(chunks))
	}
	var idx []int
	for _, c := range chunks {
		idx = append(idx, c.Choices[0].Index)
	}
	if !slices.Equal(idx, []int{0, 1, 0, 1}) {
		t.Fatalf("indexes %v", idx)
	}
}

func TestStreamingIsRealTime(t *testing.T) {
	// 100 ms TTFT overhead and 200 ms between tokens after scaling.
	const ttft, itl = 100 * time.Millisecond, 200 * time.Millisecond
	_, base := startServer(t, func(c *Config) {
		c.TimeScale = 0.01
		c.TTFTOverhead = 100 * ttft
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 100 * itl
	})
	_, evs, done, err, _ := stream(t, base+PathCompletions, `{"prompt":"a","stream":true,"max_tokens":4}`)
	if err != nil || !done || len(evs) != 4 {
		t.Fatalf("done=%v err=%v events=%d", done, err, len(evs))
	}
	// No event comes before its time (a busy machine only delays them, so
	// the gaps the client sees are no test: a late event shortens the next
	// gap), and the first comes well before the last token is made, which a
	// buffered stream would hold it for.
	const slack = 10 * time.Millisecond
	for i, ev := range evs {
		if due := ttft + time.Duration(i)*itl; ev.at < due-slack {
			t.Errorf("event %d after %v, before its time %v", i, ev.at, due)
		}
	}
	if last := ttft + 3*itl; evs[0].at > last-itl {
		t.Errorf("first event after %v: held until near the last token (%v), buffered", evs[0].at, last)
	}
}

func TestPrefillCostDependsOnCache(t *testing.T) {
	// 2 ms per uncached token: 161 tokens cold ≈ 320 ms; warm only 1 uncached.
	_, base := startServer(t, func(c *Config) {
		c.TimeScale = 0.001
		c.TTFTOverhead = 0
		c.PerTokenPrefill = 2 * time.Second
		c.InterTokenLatency = 0
	})
	body := chatBody(words(160), `,"max_tokens":1`)
	t0 := time.Now()
	post(t, base+PathChat, body)
	cold := time.Since(t0)
	t0 = time.Now()
	_, b := post(t, base+PathChat, body)
	warm := time.Since(t0)
	if decode[respJSON](t, b).Usage.PromptTokensDetails.CachedTokens != 160 {
		t.Fatalf("warm usage: %s", b)
	}
	if cold < 250*time.Millisecond || warm > cold/2 {
		t.Fatalf("cold %v warm %v", cold, warm)
	}
}

func TestMaxRunningQueues(t *testing.T) {
	s, base := startServer(t, func(c *Config) {
		c.MaxRunning = 1
		c.TimeScale = 0.01
		c.TTFTOverhead = 10 * time.Second // 100 ms each
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 0
	})
	var wg sync.WaitGroup
	start := time.Now()
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, b := post(t, base+PathCompletions, `{"prompt":"a","max_tokens":1}`); resp.StatusCode != 200 {
				t.Errorf("status %d: %s", resp.StatusCode, b)
			}
		}()
	}
	waitFor(t, "queue to fill", func() bool { return s.Stats().Running == 1 && s.Stats().Waiting == 2 })
	m := scrape(t, base)
	if m["vllm:num_requests_running"] != 1 || m["vllm:num_requests_waiting"] != 2 {
		t.Fatalf("metrics while queued: %v", m)
	}
	wg.Wait()
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("3 serialized requests took %v, want >= ~300ms", el)
	}
	if st := s.Stats(); st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("after: %+v", st)
	}
}

// scrape parses /metrics into name -> value, checking the model label.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, b := do(t, http.MethodGet, base+PathMetrics, "")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("metrics status %d", resp.StatusCode)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, ok := strings.Cut(line, "{")
		labels, val, ok2 := strings.Cut(rest, "} ")
		if strings.HasPrefix(name, "vllm:time_to_first_token_seconds") {
			labels, _, _ = strings.Cut(labels, ",le=")
		}
		if name == "vllm:cache_config_info" {
			// vLLM's config as labels, without the model's: the block size is its figure here.
			bs, _, _ := strings.Cut(strings.TrimPrefix(labels, `block_size="`), `"`)
			labels, val = `model_name="llama"`, bs
		}
		if !ok || !ok2 || labels != `model_name="llama"` {
			t.Fatalf("bad metric line %q", line)
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("bad value in %q", line)
		}
		out[name] = v
	}
	return out
}

func TestMetrics(t *testing.T) {
	_, base := startServer(t, func(c *Config) { c.CacheBlocks = 100 })
	body := chatBody(words(40), "") // 41 tokens, 2 full blocks
	post(t, base+PathChat, body)
	post(t, base+PathChat, body)
	post(t, base+PathChat, `{bad`) // counted as a request, no tokens
	m := scrape(t, base)
	want := map[string]float64{
		"vllm:num_requests_running":              0,
		"vllm:num_requests_waiting":              0,
		"vllm:kv_cache_usage_perc":               0.02,
		"vllm:prefix_cache_queries_total":        82,
		"vllm:prefix_cache_hits_total":           32,
		"mock_requests_total":                    3,
		"mock_prompt_tokens_total":               82,
		"vllm:cache_config_info":                 16, // the block size
		"vllm:time_to_first_token_seconds_count": 2,
	}
	for k, v := range want {
		got, ok := m[k]
		if !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
}

func TestKVSinkThroughHTTP(t *testing.T) {
	sink := &fakeSink{}
	_, base := startServer(t, func(c *Config) {
		c.KVEvents = sink
		c.BlockSize = 4
		c.CacheBlocks = 3
	})
	post(t, base+PathCompletions, `{"prompt":[1,2,3,4,5,6,7,8,9],"max_tokens":1}`)
	ev := sink.take()
	if len(ev) != 1 || ev[0].kind != "stored" || len(ev[0].hashes) != 2 || !slices.Equal(ev[0].tokens, seq(1, 8)) || ev[0].blockSize != 4 {
		t.Fatalf("stored: %+v", ev)
	}
	post(t, base+PathCompletions, `{"prompt":[20,21,22,23,24,25,26,27],"max_tokens":1}`)
	ev = sink.take()
	if len(ev) != 2 || ev[0].kind != "removed" || len(ev[0].hashes) != 1 || ev[1].kind != "stored" {
		t.Fatalf("eviction: %+v", ev)
	}
	if resp, _ := post(t, base+PathResetPrefixCache, ""); resp.StatusCode != 200 {
		t.Fatalf("reset status %d", resp.StatusCode)
	}
	if ev = sink.take(); len(ev) != 1 || ev[0].kind != "cleared" {
		t.Fatalf("reset: %+v", ev)
	}
	_, b := post(t, base+PathCompletions, `{"prompt":[20,21,22,23,24,25,26,27],"max_tokens":1}`)
	if decode[respJSON](t, b).Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatal("cache not cleared by /reset_prefix_cache")
	}
}

func TestTokenizeMatchesCache(t *testing.T) {
	s, base := startServer(t, nil)
	msgs := `"messages":[{"role":"system","content":"sys prompt"},{"role":"user","content":[{"type":"text","text":"` + words(30) + `"},{"type":"image_url","image_url":{"url":"u"}}]}]`
	_, b := post(t, base+PathTokenize, `{"model":"llama",`+msgs+`}`)
	var tok struct {
		Count       int             `json:"count"`
		MaxModelLen int             `json:"max_model_len"`
		Tokens      []int32         `json:"tokens"`
		TokenStrs   json.RawMessage `json:"token_strs"`
	}
	if err := json.Unmarshal(b, &tok); err != nil {
		t.Fatal(err)
	}
	chatReq := `{"model":"llama",` + msgs + `,"max_tokens":1}`
	want, _ := ChatPromptTokens([]byte(chatReq))
	if tok.Count != len(want) || !slices.Equal(tok.Tokens, want) || tok.MaxModelLen != 8192 || string(tok.TokenStrs) != "null" {
		t.Fatalf("tokenize %s, want tokens %v", b, want)
	}
	post(t, base+PathChat, chatReq)
	for _, h := range BlockHashes(tok.Tokens, 16) {
		if !s.Cache().Contains(h) {
			t.Fatalf("block %x from /tokenize tokens not in cache", h)
		}
	}
	_, b = post(t, base+PathTokenize, `{"prompt":"a  b"}`)
	if !strings.Contains(string(b), fmt.Sprintf(`"tokens":[%d,%d]`, TokenID("a"), TokenID("b"))) {
		t.Fatalf("prompt tokenize: %s", b)
	}
	if resp, _ := post(t, base+PathTokenize, `{"prompt":["a","b"]}`); resp.StatusCode != 400 {
		t.Fatalf("batch tokenize status %d", resp.StatusCode)
	}
}

func TestErrorsAndRouting(t *testing.T) {
	_, base := startServer(t, func(c *Config) { c.Models = []string{"llama", "qwen"}; c.StrictModels = true })
	tests := []struct {
		name, method, path, body string
		status                   int
		errType                  string
	}{
		{"unknown path", "GET", "/v2/nope", "", 404, "NotFoundError"},
		{"bad json", "POST", PathChat, `{"messages":`, 400, "BadRequestError"},
		{"bad prompt", "POST", PathCompletions, `{"prompt":{}}`, 400, "BadRequestError"},
		{"zero max_tokens", "POST", PathCompletions, `{"prompt":"a","max_tokens":0}`, 400, "BadRequestError"},
		{"unknown model", "POST", PathChat, `{"model":"gpt","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError"},
		{"wrong method", "GET", PathChat, "", 405, "MethodNotAllowedError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, tc.method, base+tc.path, tc.body)
			if resp.StatusCode != tc.status || resp.Header.Get(HeaderReplica) != "r1" {
				t.Fatalf("status %d replica %q", resp.StatusCode, resp.Header.Get(HeaderReplica))
			}
			e := decode[errJSON](t, b)
			if e.Error.Type != tc.errType || e.Error.Code != tc.status || e.Error.Message == "" {
				t.Fatalf("error body %s", b)
			}
		})
	}
	resp, b := do(t, "GET", base+PathModels, "")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &models); err != nil || resp.StatusCode != 200 || models.Object != "list" ||
		len(models.Data) != 2 || models.Data[0].ID != "llama" || models.Data[1].ID != "qwen" {
		t.Fatalf("models: %s", b)
	}
	_, b = post(t, base+PathChat, `{"model":"qwen","messages":[{"role":"user","content":"x"}]}`)
	if decode[respJSON](t, b).Model != "qwen" {
		t.Fatalf("model echo: %s", b)
	}
}

func TestFaults(t *testing.T) {
	s, base := startServer(t, nil)

	t.Run("health", func(t *testing.T) {
		if resp, b := do(t, "GET", base+PathHealth, ""); resp.StatusCode != 200 || len(b) != 0 || resp.Header.Get(HeaderReplica) != "r1" {
			t.Fatalf("health %d %q", resp.StatusCode, b)
		}
		post(t, base+PathFaults, `{"unhealthy":true}`)
		if resp, _ := do(t, "GET", base+PathHealth, ""); resp.StatusCode != 503 {
			t.Fatalf("unhealthy health %d", resp.StatusCode)
		}
		// Completions keep working while unhealthy.
		if resp, _ := post(t, base+PathCompletions, `{"prompt":"a"}`); resp.StatusCode != 200 {
			t.Fatalf("completion while unhealthy: %d", resp.StatusCode)
		}
		post(t, base+PathFaults, `{"unhealthy":false}`)
		if resp, _ := do(t, "GET", base+PathHealth, ""); resp.StatusCode != 200 {
			t.Fatalf("healthy again %d", resp.StatusCode)
		}
	})

	t.Run("fail rate deterministic", func(t *testing.T) {
		run := func() []int {
			post(t, base+PathFaults, `{"fail_rate":0.5,"seed":7}`)
			var st []int
			for range 30 {
				resp, b := post(t, base+PathCompletions, `{"prompt":"a","max_tokens":1}`)
				if resp.StatusCode == 500 {
					if e := decode[errJSON](t, b); e.Error.Code != 500 || e.Error.Type != "InternalServerError" {
						t.Fatalf("error body %s", b)
					}
				}
				st = append(st, resp.StatusCode)
			}
			return st
		}
		a, b := run(), run()
		if !slices.Equal(a, b) {
			t.Fatalf("same seed, different outcomes:\n%v\n%v", a, b)
		}
		fails := 0
		for _, c := range a {
			if c == 500 {
				fails++
			}
		}
		if fails == 0 || fails == len(a) {
			t.Fatalf("fail_rate 0.5 gave %d/%d failures", fails, len(a))
		}
		before := s.Stats().Failed
		post(t, base+PathFaults, `{"fail_rate":1}`)
		post(t, base+PathChat, chatBody("x", ""))
		if s.Stats().Failed != before+1 {
			t.Fatal("Failed counter not incremented")
		}
		post(t, base+PathFaults, `{"fail_rate":0}`)
	})

	t.Run("stall is real time", func(t *testing.T) {
		resp, b := post(t, base+PathFaults, `{"stall":"150ms"}`)
		if f := decode[map[string]any](t, b); resp.StatusCode != 200 || f["stall_ms"] != 150.0 {
			t.Fatalf("faults reply %s", b)
		}
		t0 := time.Now()
		post(t, base+PathCompletions, `{"prompt":"a","max_tokens":1}`)
		if el := time.Since(t0); el < 140*time.Millisecond {
			t.Fatalf("stalled request took %v (TimeScale 0 must not shrink Stall)", el)
		}
		post(t, base+PathFaults, `{"stall_ms":0}`)
	})

	t.Run("die mid stream", func(t *testing.T) {
		post(t, base+PathFaults, `{"die_after_chunks":3}`)
		defer post(t, base+PathFaults, `{"die_after_chunks":0}`)
		_, evs, done, err, _ := stream(t, base+PathChat, chatBody("x", `,"stream":true,"max_tokens":10`))
		if done || len(evs) != 3 || err == nil {
			t.Fatalf("done=%v events=%d err=%v", done, len(evs), err)
		}
		// Non-streaming requests are unaffected.
		if resp, _ := post(t, base+PathChat, chatBody("x", "")); resp.StatusCode != 200 {
			t.Fatalf("non-stream status %d", resp.StatusCode)
		}
		// The replica keeps serving new streams.
		post(t, base+PathFaults, `{"die_after_chunks":0}`)
		if _, _, done, err, _ := stream(t, base+PathChat, chatBody("x", `,"stream":true`)); !done || err != nil {
			t.Fatalf("stream after die: done=%v err=%v", done, err)
		}
	})

	t.Run("bad fault input", func(t *testing.T) {
		for _, body := range []string{`{"fail_rate":2}`, `{"stall":"soon"}`, `nope`} {
			if resp, _ := post(t, base+PathFaults, body); resp.StatusCode != 400 {
				t.Fatalf("%s: status %d", body, resp.StatusCode)
			}
		}
	})
}

func TestPrefillDecodeRoles(t *testing.T) {
	pre, preBase := startServer(t, func(c *Config) { c.Name = "pre"; c.Role = RolePrefill })
	// Only the cases that assert timing run on the slow replica.
	_, fastDecBase := startServer(t, func(c *Config) { c.Name = "dec"; c.Role = RoleDecode })
	_, decBase := startServer(t, func(c *Config) {
		c.Name = "dec"
		c.Role = RoleDecode
		c.TimeScale = 0.001
		c.TTFTOverhead = 0
		c.PerTokenPrefill = 5 * time.Second // 5 ms per uncached token
		c.InterTokenLatency = 0
	})
	prompt := words(40) // 40 tokens -> 3 blocks (2 full + partial)
	pdReq := `{"model":"llama","prompt":"` + prompt + `","max_tokens":1,"stream":false,` +
		`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`
	resp, b := post(t, preBase+PathCompletions, pdReq)
	r := decode[respJSON](t, b)
	kv := r.KVTransferParams
	port, _ := strconv.Atoi(strings.Split(pre.Addr().String(), ":")[1])
	if resp.StatusCode != 200 || kv == nil || !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteEngineID != "pre" ||
		len(kv.RemoteBlockIDs) != 3 || kv.RemoteHost != "127.0.0.1" || kv.RemotePort != port || kv.TPSize != 1 {
		t.Fatalf("prefill response: %s", b)
	}
	if r.Usage.CompletionTokens != 1 || *r.Choices[0].Text != "tok1" {
		t.Fatalf("prefill must answer one token: %s", b)
	}
	// Even a streaming request gets the JSON answer on the P/D path.
	resp, b = post(t, preBase+PathCompletions, strings.Replace(pdReq, `"stream":false`, `"stream":true`, 1))
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || decode[respJSON](t, b).KVTransferParams == nil {
		t.Fatalf("streaming P/D request: %s", b)
	}
	// Without do_remote_decode the prefill replica behaves normally.
	_, b = post(t, preBase+PathCompletions, `{"prompt":"a","max_tokens":2}`)
	if r := decode[respJSON](t, b); r.KVTransferParams != nil || r.Usage.CompletionTokens != 2 {
		t.Fatalf("plain request on prefill replica: %s", b)
	}

	kvJSON, _ := json.Marshal(kv)
	withKV := func(p string) string {
		return `{"model":"llama","prompt":"` + prompt + `","max_tokens":2,"kv_transfer_params":` + p + `}`
	}
	mutate := func(f func(m map[string]any)) string {
		var m map[string]any
		_ = json.Unmarshal(kvJSON, &m)
		f(m)
		out, _ := json.Marshal(m)
		return withKV(string(out))
	}
	tests := []struct {
		name       string
		body       string
		header     string
		timed      bool
		fast       bool
		wantCached int
	}{
		{"valid", withKV(string(kvJSON)), KVTransferValid, true, true, 32},
		{"valid untimed", withKV(string(kvJSON)), KVTransferValid, false, true, 32},
		{"block count mismatch", mutate(func(m map[string]any) { m["remote_block_ids"] = []int{1, 2} }), KVTransferInvalid, true, false, 0},
		{"missing host", mutate(func(m map[string]any) { delete(m, "remote_host") }), KVTransferInvalid, false, false, 0},
		{"zero port", mutate(func(m map[string]any) { m["remote_port"] = 0 }), KVTransferInvalid, false, false, 0},
		{"empty engine", mutate(func(m map[string]any) { m["remote_engine_id"] = "" }), KVTransferInvalid, false, false, 0},
		{"block ids not a list", mutate(func(m map[string]any) { m["remote_block_ids"] = "x" }), KVTransferInvalid, false, false, 0},
		{"port not a number", mutate(func(m map[string]any) { m["remote_port"] = "x" }), KVTransferInvalid, false, false, 0},
		{"not remote prefill", mutate(func(m map[string]any) { m["do_remote_prefill"] = false }), KVTransferNone, false, false, 0},
		{"no params", `{"model":"llama","prompt":"` + prompt + `","max_tokens":2}`, KVTransferNone, true, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := fastDecBase
			if tc.timed {
				base = decBase
			}
			post(t, base+PathResetPrefixCache, "")
			t0 := time.Now()
			resp, b := post(t, base+PathCompletions, tc.body)
			el := time.Since(t0)
			if resp.StatusCode != 200 || resp.Header.Get(HeaderKVTransfer) != tc.header {
				t.Fatalf("status %d X-KV-Transfer %q: %s", resp.StatusCode, resp.Header.Get(HeaderKVTransfer), b)
			}
			r := decode[respJSON](t, b)
			if r.Usage.PromptTokensDetails.CachedTokens != tc.wantCached || r.Usage.CompletionTokens != 2 || r.KVTransferParams != nil {
				t.Fatalf("usage %s", b)
			}
			// 40 uncached tokens at 5 ms each ≈ 200 ms; transferred KV skips it.
			if tc.timed && tc.fast && el > 120*time.Millisecond {
				t.Fatalf("valid transfer took %v, want overhead only", el)
			}
			if tc.timed && !tc.fast && el < 150*time.Millisecond {
				t.Fatalf("computed prefill took only %v", el)
			}
		})
	}
}

func TestRequestLog(t *testing.T) {
	_, base := startServer(t, func(c *Config) { c.RequestLogSize = 3 })
	_, b := post(t, base+PathChat, chatBody("hi", ""), "X-Session-Id", "sess-1", "X-Request-Id", "req-9", "Authorization", "Bearer k")
	if id := decode[respJSON](t, b).ID; id != "chatcmpl-req-9" {
		t.Fatalf("id %q, want chatcmpl-req-9", id)
	}
	post(t, base+PathCompletions, `{not json`)
	do(t, "GET", base+PathHealth, "") // not logged
	_, b = do(t, "GET", base+PathRequests, "")
	type entry struct {
		Method     string            `json:"method"`
		Path       string            `json:"path"`
		Body       json.RawMessage   `json:"body"`
		Headers    map[string]string `json:"headers"`
		ReceivedNs int64             `json:"received_ns"`
	}
	var log []entry
	if err := json.Unmarshal(b, &log); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if len(log) != 2 {
		t.Fatalf("entries %s", b)
	}
	e := log[0]
	if e.Method != "POST" || e.Path != PathChat || e.Headers["x-session-id"] != "sess-1" || e.Headers["x-request-id"] != "req-9" ||
		e.ReceivedNs <= 0 || e.Headers["authorization"] != "" {
		t.Fatalf("entry %+v", e)
	}
	var body map[string]any
	if err := json.Unmarshal(e.Body, &body); err != nil || body["model"] != "llama" {
		t.Fatalf("body %s", e.Body)
	}
	var bad string
	if err := json.Unmarshal(log[1].Body, &bad); err != nil || bad != "{not json" {
		t.Fatalf("bad body kept as %s", log[1].Body)
	}
	// Ring keeps the newest 3, oldest first.
	for i := range 4 {
		post(t, base+PathCompletions+"?n="+strconv.Itoa(i), `{"prompt":"`+strconv.Itoa(i)+`"}`)
	}
	_, b = do(t, "GET", base+PathRequests, "")
	log = nil
	if err := json.Unmarshal(b, &log); err != nil || len(log) != 3 {
		t.Fatalf("ring: %s", b)
	}
	for i, e := range log {
		if want := `{"prompt":"` + strconv.Itoa(i+1) + `"}`; string(e.Body) != want {
			t.Fatalf("ring[%d] body %s, want %s", i, e.Body, want)
		}
	}
	post(t, base+PathRequestsClear, "")
	if _, b = do(t, "GET", base+PathRequests, ""); string(b) != "[]" {
		t.Fatalf("after clear: %s", b)
	}
}

func TestCloseAbortsInflight(t *testing.T) {
	s, base := startServer(t, func(c *Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 0
		c.InterTokenLatency = time.Second
	})
	// The timeout turns a regression (e.g. unflushed first chunk) into a
	// failure instead of a 100 s hang.
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post(base+PathCompletions, "application/json", strings.NewReader(`{"prompt":"a","stream":true,"max_tokens":100}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // first token arrived
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el > 2*time.Second {
		t.Fatalf("Close took %v", el)
	}
	if _, err := io.ReadAll(br); err == nil {
		t.Fatal("stream should end with an error after Close")
	}
	if _, err := http.Get(base + PathHealth); err == nil {
		t.Fatal("server still accepting after Close")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, mut := range []func(*Config){
		func(c *Config) { c.Role = "both" },
		func(c *Config) { c.FailRate = 1.5 },
		func(c *Config) { c.TimeScale = -1 },
		func(c *Config) { c.Models = []string{""} },
	} {
		cfg := DefaultConfig()
		mut(&cfg)
		if _, err := New(cfg, nil); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	// Zero config gets defaults.
	s, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config(); c.Name != "mock" || c.BlockSize != 16 || c.CacheBlocks != 4096 || c.Models[0] != "llama" || c.Role != RoleMixed {
		t.Fatalf("defaults %+v", c)
	}
}

func TestRawHeaderNames(t *testing.T) {
	_, base := startServer(t, func(c *Config) { c.Role = RoleDecode })
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"prompt":"a","max_tokens":1}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	raw, _ := io.ReadAll(conn)
	for _, want := range []string{"\r\nX-Replica: r1\r\n", "\r\nX-KV-Transfer: none\r\n"} {
		if !strings.Contains(string(raw), want) {
			t.Fatalf("raw response lacks %q:\n%s", want, raw)
		}
	}
}

// TestTokenIDOffset: with an id offset, /tokenize and the KV events agree
// on ids at or above 2^31 (what turnout must accept from both).
func TestTokenIDOffset(t *testing.T) {
	sink := &fakeSink{}
	_, base := startServer(t, func(c *Config) { c.TokenIDOffset = 1 << 31; c.BlockSize = 4; c.KVEvents = sink })
	const prompt = `"prompt":"a b c d e f g h"`
	_, b := post(t, base+PathTokenize, `{`+prompt+`}`)
	var tok struct {
		Tokens []uint64 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &tok); err != nil || len(tok.Tokens) != 8 {
		t.Fatalf("tokenize %s: %v", b, err)
	}
	for i, v := range tok.Tokens {
		if want := uint64(TokenID(strings.Fields("a b c d e f g h")[i])) + 1<<31; v != want {
			t.Fatalf("token %d = %d, want %d", i, v, want)
		}
	}
	post(t, base+PathCompletions, `{`+prompt+`,"max_tokens":1}`)
	ev := sink.take()
	if len(ev) != 1 || len(ev[0].tokens) != 8 {
		t.Fatalf("events %+v", ev)
	}
	for i, v := range ev[0].tokens {
		if uint64(uint32(v)) != tok.Tokens[i] {
			t.Fatalf("event token %d = %d, /tokenize said %d", i, uint32(v), tok.Tokens[i])
		}
	}
}
