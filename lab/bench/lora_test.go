package bench

import (
	"testing"
	"time"
)

// The LoRA replay: loads are counted where a replica did not hold the
// adapter, and lora-affinity switches adapters far less than least-request
// on a skewed mix (the BENCHMARKS.md row, at a small scale).
func TestLoRAReplay(t *testing.T) {
	// Hand-checked: one replica holding one adapter: a, a, b, a = 3 loads.
	o := tinySim(1, 0)
	o.LoRA = LoRAOptions{Adapters: 2, Zipf: 1.1, MaxLoRAs: 1, LoRALoadCost: 100 * time.Millisecond}
	var reqs []Request
	for i, a := range []string{"lora-0", "lora-0", "lora-1", "lora-0"} {
		reqs = append(reqs, Request{Index: i, Arrival: time.Duration(i) * time.Second, InputTokens: 7, OutputTokens: 1, Model: a})
	}
	res, err := Simulate(reqs, &rrRouter{n: 1}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.AdapterLoads != 3 {
		t.Fatalf("%d loads, want 3", res.AdapterLoads)
	}
	if res.TTFT[0]-res.TTFT[1] != 100*time.Millisecond || res.TTFT[2] != res.TTFT[0] || res.TTFT[3] != res.TTFT[0] {
		t.Fatalf("TTFT %v: a hot adapter costs nothing, a load 100 ms", res.TTFT)
	}

	o = tinySim(4, 8)
	o.Compress = 0.1 // a replica keeps up: the queues do not hide the loads
	// Per request: the synthetic trace's few system prompts would name only a few adapters.
	o.LoRA = LoRAOptions{Adapters: 20, Zipf: 1.1, MaxLoRAs: 4, LoRALoadCost: 200 * time.Millisecond, PerRequest: true}
	rows, err := RunSim(SyntheticTrace(2000, 1), "synthetic", []PolicySpec{{Policy: "least-request"}, {Policy: "lora-affinity"}}, o)
	if err != nil {
		t.Fatal(err)
	}
	lr, la := rows[0], rows[1]
	if !lr.Adapters || lr.Requests != 2000 || la.Requests != 2000 {
		t.Fatalf("rows %+v %+v", lr, la)
	}
	t.Logf("adapter loads: least-request %d, lora-affinity %d; TTFT p50 %.0f/%.0f p90 %.0f/%.0f", lr.AdapterLoads, la.AdapterLoads, lr.TTFT.P50, la.TTFT.P50, lr.TTFT.P90, la.TTFT.P90)
	if la.AdapterLoads*3 > lr.AdapterLoads {
		t.Errorf("lora-affinity loaded adapters %d times, least-request %d: want at least 3x fewer", la.AdapterLoads, lr.AdapterLoads)
	}
}

// WithAdapters draws one adapter per prompt root: requests sharing a first
// hash id (a conversation, an application's prompt) name the same adapter,
// so a cache keyed by adapter can still hit their shared prefix; the draw
// still spreads the roots over several adapters.
func TestWithAdaptersPerRoot(t *testing.T) {
	var reqs []Request
	for i := range 600 {
		reqs = append(reqs, Request{Index: i, InputTokens: 1000, OutputTokens: 1, HashIDs: []uint64{uint64(i % 60), uint64(1000 + i)}})
	}
	reqs = append(reqs, Request{Index: 600, InputTokens: 10, OutputTokens: 1})
	out := WithAdapters(reqs, LoRAOptions{Adapters: 20, Zipf: 1.1, MaxLoRAs: 4}, 7)
	byRoot := map[uint64]string{}
	used := map[string]bool{}
	for i, r := range out {
		if r.Model == "" || reqs[i].Model != "" {
			t.Fatalf("request %d: model %q (input %q)", i, r.Model, reqs[i].Model)
		}
		used[r.Model] = true
		if len(r.HashIDs) == 0 {
			continue
		}
		if a, ok := byRoot[r.HashIDs[0]]; ok && a != r.Model {
			t.Fatalf("request %d: root %d named %s and %s", i, r.HashIDs[0], a, r.Model)
		}
		byRoot[r.HashIDs[0]] = r.Model
	}
	if len(byRoot) < 10 || len(used) < 5 {
		t.Fatalf("%d roots over %d adapters: want a spread", len(byRoot), len(used))
	}
}
