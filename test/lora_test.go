//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/nginx"
)

// Issue 25 acceptance: four replicas with different LoRA adapter sets
// behind HAProxy (SPOE) and nginx (body mode): each adapter's requests
// reach only replicas that serve it (the replicas are strict, like vLLM, so
// a wrong pick would be a 404), a model no replica serves gets the
// documented 404, an adapter loaded at run time on one replica gets its
// requests within one refresh interval, and one unloaded everywhere gets
// 503 model_unavailable (relayed, not failed open).

// loraSets are the adapters of replica i.
var loraSets = [][]string{{"a1", "a2"}, {"a2", "a3"}, {"a3", "a4"}, {"a4", "a1"}}

const loraRefresh = 300 * time.Millisecond

func loraMocks(t *testing.T, prefix string) []*Mock {
	out := make([]*Mock, len(loraSets))
	for i, set := range loraSets {
		out[i] = StartMock(t, fmt.Sprintf("%s-%d", prefix, i), func(c *mock.Config) {
			c.Models = []string{"llama"}
			c.StrictModels = true
			c.MaxLoRAs = 2
			for _, a := range set {
				c.LoRAModules = append(c.LoRAModules, mock.LoRAModule{Name: a, Path: "/adapters/" + a})
			}
		})
	}
	return out
}

// withModelsInterval sets health.models_interval in a stack's config and
// lets the deployment load the od-* adapters it lists on demand.
func withModelsInterval(y string) string {
	y = strings.Replace(y, "    policy: {name: least-request}\n", "    policy: {name: least-request}\n    lora: {load_on_demand: true, adapters: [\"od-*\"], allow: [od-1], load_timeout: 2s}\n", 1)
	return strings.Replace(y, "health: {interval: 300ms, timeout: 300ms", fmt.Sprintf("health: {models_interval: %s, interval: 300ms, timeout: 300ms", loraRefresh), 1)
}

func TestHAProxyLoRA(t *testing.T) {
	NeedHAProxy(t)
	ms := loraMocks(t, "hl")
	s := &hstack{
		t: t, dir: t.TempDir(), turnoutAddr: FreeAddr(t), haAddr: FreeAddr(t), syslog: FreeUDPAddr(t),
		failMode: "open", spoeAddr: spoeDefault, deps: []depSpec{{name: "llama", policy: policyLeast, mocks: ms}},
		client: &http.Client{Timeout: 30 * time.Second},
	}
	s.T = StartTurnout(t, s.turnoutAddr, withModelsInterval(s.yaml()), "--haproxy-dir", s.dir, "--watch", "100ms")
	s.H = StartRenderedHAProxy(t, s.dir, s.haAddr)
	s.H.WaitServersUp(t, serverIDs("llama_mixed", ms)...)
	checkLoRA(t, s.T, ms, func(body []byte) *Response { return s.post(t, "/v1/chat/completions", body, nil) })
}

func TestNginxLoRA(t *testing.T) {
	NeedNginx(t)
	ms := loraMocks(t, "nl")
	s := &nstack{failMode: "open", deps: []ndep{{name: "llama", policy: policyLeast, mode: "body", mocks: ms}}}
	s.t, s.dir, s.turnoutAddr, s.ngAddr, s.syslog = t, t.TempDir(), FreeAddr(t), FreeAddr(t), FreeUDPAddr(t)
	s.client = &http.Client{Timeout: 30 * time.Second}
	extra := []string{"--nginx-dir", s.dir, "--watch", "100ms"}
	if os.Geteuid() == 0 {
		extra = append(extra, "--nginx-user", "root")
	}
	s.T = StartTurnout(t, s.turnoutAddr, withModelsInterval(s.yaml()), extra...)
	Eventually(t, 20*time.Second, "turnout to write nginx.conf", func() bool {
		_, err := os.Stat(filepath.Join(s.dir, nginx.ConfigFile))
		return err == nil
	})
	s.N = StartNginx(t, s.dir, s.ngAddr)
	checkLoRA(t, s.T, ms, func(body []byte) *Response { return s.post(t, "/v1/chat/completions", body, nil) })
}

func checkLoRA(t *testing.T, tu *Turnout, ms []*Mock, post func([]byte) *Response) {
	t.Helper()
	// The model table has learned every replica's adapters.
	Eventually(t, 10*time.Second, "turnout to learn the adapters", func() bool {
		body := readyzVerbose(t, tu)
		for _, a := range []string{"a1", "a2", "a3", "a4"} {
			if !strings.Contains(body, "adapter "+a+": served by 2/4") {
				return false
			}
		}
		return true
	})
	serving := func(adapter string) []string {
		var out []string
		for i, set := range loraSets {
			if slices.Contains(set, adapter) {
				out = append(out, ms[i].Name)
			}
		}
		return out
	}
	for _, a := range []string{"a1", "a2", "a3", "a4", "llama"} {
		got := map[string]int{}
		for i := range 24 {
			r := post(chatBody(a, "sys", fmt.Sprintf("q%d", i), false))
			if r.Status != 200 {
				t.Fatalf("%s request %d: %d %s", a, i, r.Status, r.Body)
			}
			got[r.Header.Get("X-Replica")]++
		}
		want := serving(a)
		if a == "llama" {
			want = []string{ms[0].Name, ms[1].Name, ms[2].Name, ms[3].Name}
		}
		for rep := range got {
			if !slices.Contains(want, rep) {
				t.Errorf("%s reached %s, which does not serve it (%v)", a, rep, got)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s used %v, want every one of %v", a, got, want)
		}
	}
	// A model no replica serves: 404 model_not_found, OpenAI-style.
	r := post(chatBody("a9", "sys", "q", false))
	var e struct {
		Error struct{ Type, Code, Message string }
	}
	if err := json.Unmarshal(r.Body, &e); r.Status != 404 || err != nil || e.Error.Code != "model_not_found" {
		t.Fatalf("unserved model: %d %s", r.Status, r.Body)
	}
	// Loaded at run time on one replica: routed there within one refresh
	// interval (plus the request's own time).
	target := ms[2]
	start := time.Now()
	if res, err := Post(context.Background(), http.DefaultClient, "http://"+target.Addr+mock.PathLoadLoRA, []byte(`{"lora_name":"a9","lora_path":"/adapters/a9"}`), nil); err != nil || res.Status != 200 {
		t.Fatalf("load a9: %v %+v", err, res)
	}
	var took time.Duration
	for {
		r := post(chatBody("a9", "sys", "q", false))
		if r.Status == 200 {
			took = time.Since(start)
			if rep := r.Header.Get("X-Replica"); rep != target.Name {
				t.Fatalf("a9 reached %s, loaded only on %s", rep, target.Name)
			}
			break
		}
		if r.Status != 404 {
			t.Fatalf("a9 while loading: %d %s", r.Status, r.Body)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("a9 not routed 10 s after its load")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("adapter loaded at run time routed after %v (models_interval %v)", took, loraRefresh)
	// One interval, plus slack for the poll itself and a busy 2-core box.
	if took > loraRefresh+400*time.Millisecond {
		t.Errorf("a9 routed %v after its load, beyond one refresh interval (%v)", took, loraRefresh)
	}
	for range 10 {
		if r := post(chatBody("a9", "sys", "q", false)); r.Status != 200 || r.Header.Get("X-Replica") != target.Name {
			t.Fatalf("a9: %d from %s", r.Status, r.Header.Get("X-Replica"))
		}
	}
	// Unloaded again: served before, so 503 model_unavailable with
	// Retry-After, relayed by the proxy rather than failed open onto a
	// replica that would answer 404. Until the next refresh the replica
	// itself answers (404 from the replica: the one window polling leaves).
	unload := time.Now()
	if res, err := Post(context.Background(), http.DefaultClient, "http://"+target.Addr+mock.PathUnloadLoRA, []byte(`{"lora_name":"a9"}`), nil); err != nil || res.Status != 200 {
		t.Fatalf("unload a9: %v %+v", err, res)
	}
	Eventually(t, 5*time.Second, "a9 to be refused after its unload", func() bool {
		r := post(chatBody("a9", "sys", "q", false))
		if r.Status == 404 && r.Header.Get("X-Replica") == target.Name && time.Since(unload) < loraRefresh+400*time.Millisecond {
			return false
		}
		if r.Status != 503 || !strings.Contains(string(r.Body), "model_unavailable") || r.Header.Get("Retry-After") == "" {
			t.Fatalf("a9 %v after unload: %d %v %s", time.Since(unload), r.Status, r.Header, r.Body)
		}
		return true
	})
	// Loaded on demand: od-1 is no replica's; turnout loads it on the one
	// its policy picks before answering, and routes it there afterwards.
	r = post(chatBody("od-1", "sys", "q", false))
	if r.Status != 200 {
		t.Fatalf("od-1 (load on demand): %d %s", r.Status, r.Body)
	}
	home := r.Header.Get("X-Replica")
	for range 5 {
		if r := post(chatBody("od-1", "sys", "q", false)); r.Status != 200 || r.Header.Get("X-Replica") != home {
			t.Fatalf("od-1 after its load: %d from %s, loaded on %s", r.Status, r.Header.Get("X-Replica"), home)
		}
	}
	if !strings.Contains(readyzVerbose(t, tu), "adapter od-1: served by 1/4") {
		t.Errorf("readyz does not show od-1 on one replica:\n%s", readyzVerbose(t, tu))
	}
	// Names a client makes up load nothing, though they match od-*: only
	// the listed od-1 was loaded; each is turnout's 404, relayed.
	for i := range 1000 {
		if r := post(chatBody(fmt.Sprintf("od-evil-%d", i), "sys", "q", false)); r.Status != 404 || r.Header.Get("X-Replica") != "" {
			t.Fatalf("od-evil-%d: %d from %q, want turnout's 404", i, r.Status, r.Header.Get("X-Replica"))
		}
	}
	if n, _ := Metric(t, tu.URL+"/metrics", "turnout_lora_loads_total"); n != 1 {
		t.Errorf("%v loads on demand, want 1 (od-1): client-chosen names must not load", n)
	}
	// No replica answered a request 404 (the mocks are strict).
	for _, m := range ms {
		if st := m.Stats(); st.Requests == 0 {
			t.Errorf("%s got no request", m.Name)
		}
	}
}

func readyzVerbose(t *testing.T, tu *Turnout) string {
	res, err := http.Get(tu.URL + "/readyz?verbose")
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return b.String()
}
