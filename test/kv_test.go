//go:build e2e

package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/kv"
)

// kvMocks starts n mock replicas that publish real vLLM-format KV events.
func kvMocks(t *testing.T, n, cacheBlocks int) ([]*Mock, map[string]string) {
	t.Helper()
	ms := make([]*Mock, n)
	addrs := map[string]string{}
	for i := range ms {
		name := fmt.Sprintf("kv-%d", i)
		l := zerolog.Nop()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		pub, err := kv.NewPublisherWithConfig(ctx, kv.PublisherConfig{
			Addr: fmt.Sprintf("tcp://127.0.0.1:%d", FreePort(t)),
			// Alternate encodings: the decoder must take every vLLM layout.
			Encoding: kv.EncodeOptions{HashAsBytes: i%2 == 1, MapEvents: i == 2},
		}, &l)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		ms[i] = StartMock(t, name, func(c *mock.Config) {
			c.BlockSize = 4
			c.CacheBlocks = cacheBlocks
			c.KVEvents = pub
		})
		addrs[name] = pub.Addr()
	}
	return ms, addrs
}

func routeOnly(t *testing.T, turnoutURL string, body []byte) string {
	t.Helper()
	r, err := Post(context.Background(), http.DefaultClient, turnoutURL+"/internal/route", body, nil)
	if err != nil || r.Status != 200 {
		t.Fatalf("route: %v %+v", err, r)
	}
	if id := r.Header.Get("X-Turnout-Decision"); id != "" {
		_, _ = Post(context.Background(), http.DefaultClient, turnoutURL+"/internal/done?id="+id, nil, nil)
	}
	return r.Header.Get("X-Turnout-Server")
}

// TestKVAware: a prompt served once by replica B routes back to B through
// HAProxy; once B evicts it (its own events say so) the prompt no longer sticks.
func TestKVAware(t *testing.T) {
	ms, pubs := kvMocks(t, 3, 48)
	s := startStack(t, "open", depSpec{
		name:   "llama",
		policy: "{name: kv-aware, params: {block_size: 4, tokenizer: {mode: remote, timeout: 500ms}}}",
		mocks:  ms,
		extra:  func(m *Mock) string { return fmt.Sprintf("kv_events: %q", pubs[m.Name]) },
	})
	events := func(name string) float64 {
		v, _ := Metric(t, s.T.URL+"/metrics", "turnout_kv_events_total", `endpoint="`+name+`"`)
		return v
	}
	prompt := chatBody("llama", "You are a meticulous assistant who answers in full sentences about cities rivers and mountains", "Name the longest river in Europe please", false)
	first := s.post(t, "/v1/chat/completions", prompt, nil)
	if first.Status != 200 {
		t.Fatalf("status %d: %s", first.Status, first.Body)
	}
	b := first.Header.Get("X-Replica")
	Eventually(t, 10*time.Second, "turnout to receive "+b+"'s BlockStored events", func() bool { return events(b) > 0 })
	for i := 0; i < 8; i++ {
		r := s.post(t, "/v1/chat/completions", prompt, nil)
		if got := r.Header.Get("X-Replica"); r.Status != 200 || got != b {
			t.Fatalf("request %d served by %s (status %d); %s holds the prompt's blocks", i, got, r.Status, b)
		}
	}
	// Evict: fill B's 48-block cache with other prompts sent to B directly.
	var bAddr string
	for _, m := range ms {
		if m.Name == b {
			bAddr = m.Addr
		}
	}
	before := events(b)
	for i := 0; i < 12; i++ {
		other := chatBody("llama", strings.Repeat(fmt.Sprintf("filler%d ", i), 30), "x", false)
		if r, err := Post(context.Background(), http.DefaultClient, "http://"+bAddr+"/v1/chat/completions", other, nil); err != nil || r.Status != 200 {
			t.Fatalf("filler: %v", err)
		}
	}
	Eventually(t, 10*time.Second, "turnout to receive "+b+"'s eviction events", func() bool { return events(b) >= before+12 })
	seen := map[string]int{}
	for i := 0; i < 30; i++ {
		seen[routeOnly(t, s.T.URL, prompt)]++
	}
	if seen[b] == 30 || len(seen) < 2 {
		t.Fatalf("after %s evicted the prompt it still gets it: %v", b, seen)
	}
	if v, err := Metric(t, s.T.URL+"/metrics", "turnout_kv_event_malformed_total"); err != nil || v != 0 {
		t.Fatalf("malformed events %v (%v)", v, err)
	}
}

// TestKVAwareGapAndModes: a sequence gap is counted; strict refuses what
// lenient routes.
func TestKVAwareGapAndModes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	pubAddr := fmt.Sprintf("tcp://127.0.0.1:%d", FreePort(t))
	if err := pub.Listen(pubAddr); err != nil {
		t.Fatal(err)
	}
	m := StartMock(t, "gap-0", nil)
	addr := FreeAddr(t)
	cfg := fmt.Sprintf(`listen: %s
health: {disable: true}
deployments:
  - name: lenient
    policy: {name: kv-aware, params: {block_size: 4, tokenizer: {mode: remote, address: "127.0.0.1:1", timeout: 100ms}}}
    pools: [{role: mixed, endpoints: [{name: gap-0, address: %q, kv_events: %q}]}]
  - name: strict
    policy: {name: kv-aware, params: {block_size: 4, strict: true, tokenizer: {mode: remote, address: "127.0.0.1:1", timeout: 100ms}}}
    pools: [{role: mixed, endpoints: [{name: strict-0, address: %q}]}]
  - name: strictnoids
    policy: {name: kv-aware, params: {block_size: 4, strict: true, tokenizer: {mode: none}}}
    pools: [{role: mixed, endpoints: [{name: strict-1, address: %q}]}]
`, addr, m.Addr, pubAddr, m.Addr, m.Addr)
	tu := StartTurnout(t, addr, cfg)
	payload, err := kv.EncodeBatch(kv.Batch{Events: []kv.Event{{Kind: kv.EventAllBlocksCleared}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	send := func(seq uint64) {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		_ = pub.Send(zmq4.NewMsgFrom([]byte(""), s[:], payload))
	}
	// ZMQ slow joiner: publish seq 0 until the subscriber has seen it.
	Eventually(t, 10*time.Second, "first event", func() bool {
		send(0)
		v, _ := Metric(t, tu.URL+"/metrics", "turnout_kv_events_total", `endpoint="gap-0"`)
		return v > 0
	})
	send(1)
	send(5) // 2..4 lost
	Eventually(t, 10*time.Second, "gap detected", func() bool {
		v, _ := Metric(t, tu.URL+"/metrics", "turnout_kv_event_gaps_total", `endpoint="gap-0"`)
		return v == 1
	})
	chat := chatBody("lenient", "system", "hello", false)
	if r, _ := Post(context.Background(), http.DefaultClient, tu.URL+"/internal/route", chat, nil); r == nil || r.Status != 200 {
		t.Fatalf("lenient with tokenizer down must route: %+v", r)
	}
	for _, tc := range []struct {
		model  string
		status int
		reason string
	}{{"strict", 503, "tokenizer_unavailable"}, {"strictnoids", 400, "token_ids_required"}} {
		r, _ := Post(context.Background(), http.DefaultClient, tu.URL+"/internal/route", chatBody(tc.model, "s", "u", false), nil)
		if r == nil || r.Status != tc.status || r.Header.Get("X-Turnout-Reason") != tc.reason {
			t.Fatalf("%s: %+v", tc.model, r)
		}
	}
	// Token-id prompts need no tokenizer, even in strict mode.
	if r, _ := Post(context.Background(), http.DefaultClient, tu.URL+"/internal/route", []byte(`{"model":"strictnoids","prompt":[1,2,3,4,5,6,7,8]}`), nil); r == nil || r.Status != 200 {
		t.Fatalf("token ids in strict mode: %+v", r)
	}
}
