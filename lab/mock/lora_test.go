package mock

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/engineload"
)

// The mock speaks vLLM's LoRA surface: adapters listed with their parent,
// runtime load and unload with vLLM's answers, vllm:lora_requests_info as
// turnout's scraper reads it, and an LRU of max_loras hot adapters whose
// misses are counted.
func TestLoRAAdapters(t *testing.T) {
	s, base := startServer(t, func(c *Config) {
		c.Models = []string{"llama"}
		c.StrictModels = true
		c.LoRAModules = []LoRAModule{{"sql", "/a/sql"}, {"chat", "/a/chat"}, {"math", "/a/math"}}
		c.MaxLoRAs = 2
	})
	models := func() map[string]string {
		_, b := do(t, "GET", base+PathModels, "")
		var l struct {
			Data []struct {
				ID     string  `json:"id"`
				Root   string  `json:"root"`
				Parent *string `json:"parent"`
			}
		}
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		out := map[string]string{}
		for _, m := range l.Data {
			p := "-"
			if m.Parent != nil {
				p = *m.Parent
			}
			out[m.ID] = p
		}
		return out
	}
	if m := models(); len(m) != 4 || m["llama"] != "-" || m["sql"] != "llama" || m["math"] != "llama" {
		t.Fatalf("models %v", m)
	}
	for _, a := range []string{"sql", "chat", "sql", "math", "chat"} {
		if res, b := post(t, base+PathCompletions, `{"model":"`+a+`","prompt":"x","max_tokens":1}`); res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", a, res.StatusCode, b)
		}
	}
	// sql, chat (2 loads), sql hot, math evicts chat, chat evicts sql: 4 loads, 2 evictions.
	if st := s.LoRA(); st.Loads != 4 || st.Evicted != 2 || strings.Join(st.Hot, ",") != "chat,math" {
		t.Fatalf("lora stats %+v", st)
	}
	_, page := do(t, "GET", base+PathMetrics, "")
	// One sample of the loads counter: the replay sums every sample of it.
	var loads []string
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, "mock_lora_loads_total") {
			loads = append(loads, line)
		}
	}
	if len(loads) != 1 || loads[0] != "mock_lora_loads_total 4" {
		t.Fatalf("mock_lora_loads_total samples %q, want one of 4", loads)
	}
	l, res, err := engineload.Parse(page)
	if err != nil || l.LoRA == nil || l.LoRA.MaxLoRA != 2 || len(l.LoRA.Running) != 0 {
		t.Fatalf("scraped %v %v %+v\n%s", res, err, l.LoRA, page)
	}
	// Runtime load and unload, with vLLM's errors.
	if res, b := post(t, base+PathLoadLoRA, `{"lora_name":"new","lora_path":"/a/new"}`); res.StatusCode != 200 || !strings.Contains(string(b), "Success") {
		t.Fatalf("load: %d %s", res.StatusCode, b)
	}
	if res, _ := post(t, base+PathLoadLoRA, `{"lora_name":"new","lora_path":"/a/new"}`); res.StatusCode != 400 {
		t.Fatalf("load twice: %d", res.StatusCode)
	}
	if m := models(); m["new"] != "llama" {
		t.Fatalf("loaded adapter not listed: %v", m)
	}
	if res, _ := post(t, base+PathCompletions, `{"model":"new","prompt":"x","max_tokens":1}`); res.StatusCode != 200 {
		t.Fatalf("new adapter: %d", res.StatusCode)
	}
	if res, _ := post(t, base+PathUnloadLoRA, `{"lora_name":"sql"}`); res.StatusCode != 200 {
		t.Fatalf("unload: %d", res.StatusCode)
	}
	if res, _ := post(t, base+PathUnloadLoRA, `{"lora_name":"sql"}`); res.StatusCode != 404 {
		t.Fatalf("unload twice: %d", res.StatusCode)
	}
	if res, _ := post(t, base+PathCompletions, `{"model":"sql","prompt":"x","max_tokens":1}`); res.StatusCode != 404 {
		t.Fatalf("unloaded adapter with strict models: %d", res.StatusCode)
	}
}

// The prefix cache is keyed by adapter, as vLLM's: a prompt cached under
// one adapter is a miss for another and for the base model, a hit for
// the same adapter again.
func TestLoRAPrefixCacheKeyedByAdapter(t *testing.T) {
	_, base := startServer(t, func(c *Config) {
		c.Models = []string{"llama"}
		c.LoRAModules = []LoRAModule{{"sql", "/a/sql"}, {"chat", "/a/chat"}}
		c.MaxLoRAs = 2
	})
	prompt := strings.Repeat("the same long prompt for every model ", 30)
	cached := func(model string) int {
		res, b := post(t, base+PathCompletions, `{"model":"`+model+`","prompt":"`+prompt+`","max_tokens":1}`)
		var out struct {
			Usage struct {
				PromptTokens  int `json:"prompt_tokens"`
				PromptDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &out); err != nil || res.StatusCode != 200 || out.Usage.PromptTokens < 64 {
			t.Fatalf("%s: %d %s %v", model, res.StatusCode, b, err)
		}
		return out.Usage.PromptDetails.CachedTokens
	}
	for i, step := range []struct {
		model string
		hit   bool
	}{{"sql", false}, {"sql", true}, {"chat", false}, {"llama", false}, {"llama", true}, {"chat", true}} {
		if got := cached(step.model); (got > 0) != step.hit {
			t.Fatalf("step %d (%s): cached_tokens %d, want a hit %v", i, step.model, got, step.hit)
		}
	}
}
