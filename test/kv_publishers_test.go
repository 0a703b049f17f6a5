//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kvVariant is one way real publishers send KV events (issue 12).
type kvVariant struct {
	name string
	n    int
	// bind: turnout binds one SUB (deployment kv_events_bind) that every
	// mock's PUB connects to (--kv-events-connect); else each mock binds
	// its PUB (--kv-events) and turnout dials it.
	bind  bool
	flags []string // extra `turnout-lab mock` flags
}

// TestKVAwarePublishers: through HAProxy, kv-aware sends each prompt to the
// replica that holds it, whatever way its events arrive. The mocks are
// `turnout-lab mock` processes, so the CLI flags are what is tested.
func TestKVAwarePublishers(t *testing.T) {
	for _, v := range []kvVariant{
		{name: "dial", n: 3},
		{name: "bind-4-publishers", n: 4, bind: true},
		{name: "map-layout", n: 3, flags: []string{"--kv-map-events", "--kv-hash-bytes"}},
		{name: "array-parent-zero", n: 3, bind: true, flags: []string{"--kv-parent-zero"}},
		{name: "token-ids-from-2_31", n: 3, flags: []string{"--token-id-offset", "2147483648"}},
	} {
		t.Run(v.name, func(t *testing.T) { checkKVPublishers(t, v) })
	}
}

func checkKVPublishers(t *testing.T, v kvVariant) {
	bin := LabBin(t)
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", FreePort(t))
	ms := make([]*Mock, v.n)
	pubs := map[string]string{}
	for i := range ms {
		name := fmt.Sprintf("kvp-%d", i)
		addr := FreeAddr(t)
		args := []string{"mock", "--listen", addr, "--name", name, "--model", "llama",
			"--block-size", "4", "--cache-blocks", "512", "--time-scale", "0.01"}
		if v.bind {
			args = append(args, "--kv-events-connect", bind)
		} else {
			pubs[name] = fmt.Sprintf("tcp://127.0.0.1:%d", FreePort(t))
			args = append(args, "--kv-events", pubs[name])
		}
		StartProc(t, name, bin, append(args, v.flags...)...)
		WaitHTTP(t, "http://"+addr+"/health", 10*time.Second)
		ms[i] = &Mock{Name: name, Addr: addr}
	}
	dep := depSpec{
		name:   "llama",
		policy: "{name: kv-aware, params: {block_size: 4, tokenizer: {mode: remote, timeout: 500ms}}}",
		mocks:  ms,
	}
	if v.bind {
		dep.depYAML = []string{"kv_events_bind: " + strconv.Quote(bind)}
	} else {
		dep.extra = func(m *Mock) string { return fmt.Sprintf("kv_events: %q", pubs[m.Name]) }
	}
	s := startStack(t, "open", dep)
	metric := func(name string, filters ...string) float64 {
		v, _ := Metric(t, s.T.URL+"/metrics", name, filters...)
		return v
	}

	// Each replica is sent its own prompt directly, so each publisher
	// (all of them, on one socket in bind mode) has something to report.
	// A PUB drops what it sends before its subscriber is connected (ZMQ's
	// slow joiner, vLLM's too), so a fresh prompt is tried until one lands.
	prompts := make([][]byte, len(ms))
	for i, m := range ms {
		Eventually(t, 20*time.Second, "turnout to index "+m.Name+"'s blocks", func() bool {
			before := metric("turnout_kv_events_total", `endpoint="`+m.Name+`"`)
			prompts[i] = chatBody("llama", fmt.Sprintf("You are replica %d's favourite assistant (take %d), answering about %s in full sentences",
				i, time.Now().UnixNano(), strings.Repeat("rivers mountains cities ", i+2)), "Tell me more please", false)
			r, err := Post(context.Background(), http.DefaultClient, "http://"+m.Addr+"/v1/chat/completions", prompts[i], nil)
			if err != nil || r.Status != 200 {
				t.Fatalf("warm %s: %v %+v", m.Name, err, r)
			}
			deadline := time.Now().Add(time.Second)
			for time.Now().Before(deadline) {
				if metric("turnout_kv_events_total", `endpoint="`+m.Name+`"`) > before {
					return true
				}
				time.Sleep(20 * time.Millisecond)
			}
			return false
		})
	}
	for i, m := range ms {
		for k := 0; k < 5; k++ {
			r := s.post(t, "/v1/chat/completions", prompts[i], nil)
			if got := r.Header.Get("X-Replica"); r.Status != 200 || got != m.Name {
				t.Fatalf("prompt %d, try %d: served by %q (status %d); %s holds it", i, k, got, r.Status, m.Name)
			}
		}
	}
	// And a prompt first served through HAProxy sticks to whoever got it.
	p := chatBody("llama", "A brand new system prompt nobody has seen before today at all", "And a question", false)
	events := map[string]float64{}
	for _, m := range ms {
		events[m.Name] = metric("turnout_kv_events_total", `endpoint="`+m.Name+`"`)
	}
	first := s.post(t, "/v1/chat/completions", p, nil)
	holder := first.Header.Get("X-Replica")
	// Only the holder was sent the prompt: once its events are indexed, the
	// prompt is known to be there and nowhere else (waiting on a lucky
	// route instead let a repeat go out before the events arrived).
	Eventually(t, 15*time.Second, "turnout to index the new prompt on "+holder, func() bool {
		return metric("turnout_kv_events_total", `endpoint="`+holder+`"`) > events[holder]
	})
	for k := 0; k < 5; k++ {
		if got := s.post(t, "/v1/chat/completions", p, nil).Header.Get("X-Replica"); got != holder {
			t.Fatalf("repeat %d served by %s, %s holds the prompt", k, got, holder)
		}
	}

	for _, bad := range []string{"turnout_kv_event_malformed_total", "turnout_kv_events_rejected_total", "turnout_kv_bind_unknown_topic_total"} {
		if got := metric(bad); got != 0 {
			t.Fatalf("%s = %v", bad, got)
		}
	}
	if got := metric("turnout_kv_tokenize_total", `result="ok"`); got == 0 {
		t.Fatal("no prompt was tokenized: routing did not use the KV index")
	}
	if v.bind {
		if got := metric("turnout_kv_bind_messages_total"); got == 0 {
			t.Fatal("bind mode received nothing on the bound socket")
		}
	}
}
