package engineload

import (
	"slices"
	"testing"
)

// Issue 25: vLLM keeps every label set of vllm:lora_requests_info it ever
// set on the page; the newest (highest timestamp) is the engine's report.
func TestParseLoRAInfo(t *testing.T) {
	page := vllmPage(2, 1, 0.5) + `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 1.7000000001e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql, chat",waiting_lora_adapters="math"} 1.7000000009e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7000000005e+09
`
	l, res, err := Parse([]byte(page))
	if res != ResultOK || err != nil {
		t.Fatalf("%v %v", res, err)
	}
	if l.Requests != 3 || l.LoRA == nil {
		t.Fatalf("%+v", l)
	}
	if !slices.Equal(l.LoRA.Running, []string{"sql", "chat"}) || !slices.Equal(l.LoRA.Waiting, []string{"math"}) || l.LoRA.MaxLoRA != 4 {
		t.Fatalf("lora %+v", *l.LoRA)
	}
	if l, _, _ := Parse([]byte(vllmPage(1, 0, 0.1))); l.LoRA != nil {
		t.Fatalf("no lora family: %+v", *l.LoRA)
	}
}
