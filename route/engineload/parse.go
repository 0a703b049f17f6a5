package engineload

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/turnout/turnout/route/fleet"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vLLM metric names. kv_cache_usage_perc replaced gpu_cache_usage_perc in
// vLLM 0.10; both are read, the newer wins.
const (
	MetricRunning = "vllm:num_requests_running"
	MetricWaiting = "vllm:num_requests_waiting"
	MetricKV      = "vllm:kv_cache_usage_perc"
	MetricKVOld   = "vllm:gpu_cache_usage_perc"
	// MetricLoRA is a gauge whose value is the time of the report and whose
	// labels name the adapters: running_lora_adapters and
	// waiting_lora_adapters (comma-separated), max_lora. Old label sets stay
	// on the page, so the newest (highest value) is the report.
	MetricLoRA = "vllm:lora_requests_info"
	// MetricCacheConfig is vLLM's cache config as labels (value 1); its
	// block_size label lets kv-aware key requests before the first KV
	// event arrives.
	MetricCacheConfig = "vllm:cache_config_info"
	// MetricTTFT is vLLM's time-to-first-token histogram; its sum and
	// count teach predicted-ttft what the proxies' feedback cannot (their
	// TTFB is the response headers' time, sent before the first token of
	// a stream).
	MetricTTFT = "vllm:time_to_first_token_seconds"
)

// Parse reads running + waiting and the KV usage from a Prometheus text
// page with the Prometheus project's own parser. Series are summed over
// labels (vLLM exports one series per engine with data parallelism); the
// KV usage is the highest of them.
//
// Only the lines of those four families are handed to the parser: a vLLM
// page is mostly histograms (~40-100 KiB), and parsing all of it costs
// ~1.7 ms and 12k allocations, against ~20 us for the lines kept
// (BENCHMARKS.md). A page without any of them is parsed whole, to tell
// garbage (parse_error) from another exporter (no_metrics).
func Parse(body []byte) (fleet.EngineLoad, Result, error) {
	if kept := keepLoadLines(body); len(kept) > 0 {
		return parse(kept)
	}
	return parse(body)
}

// loadFamilies are the metric names Parse reads.
var loadFamilies = [...][]byte{[]byte(MetricRunning), []byte(MetricWaiting), []byte(MetricKV), []byte(MetricKVOld), []byte(MetricLoRA), []byte(MetricCacheConfig),
	[]byte(MetricTTFT), []byte(MetricTTFT + "_sum"), []byte(MetricTTFT + "_count")}

// keepLoadLines returns the sample, HELP and TYPE lines of loadFamilies.
func keepLoadLines(body []byte) []byte {
	var out []byte
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i+1], body[i+1:]
		} else {
			body = nil
		}
		name := line
		if bytes.HasPrefix(name, []byte("# HELP ")) || bytes.HasPrefix(name, []byte("# TYPE ")) {
			name = name[7:]
		}
		for _, f := range loadFamilies {
			if len(name) > len(f) && bytes.HasPrefix(name, f) && (name[len(f)] == '{' || name[len(f)] == ' ' || name[len(f)] == '\t') {
				out = append(out, line...)
				if line[len(line)-1] != '\n' {
					out = append(out, '\n')
				}
				break
			}
		}
	}
	return out
}

func parse(body []byte) (fleet.EngineLoad, Result, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return fleet.EngineLoad{}, ResultParse, fmt.Errorf("parse metrics: %w", err)
	}
	running, okR := sum(fams[MetricRunning])
	waiting, okW := sum(fams[MetricWaiting])
	if !okR && !okW {
		return fleet.EngineLoad{}, ResultNoMetrics, fmt.Errorf("no %s or %s on the page", MetricRunning, MetricWaiting)
	}
	kv, ok := maxOf(fams[MetricKV])
	if !ok {
		if kv, ok = maxOf(fams[MetricKVOld]); !ok {
			kv = -1
		}
	}
	el := fleet.EngineLoad{Requests: int64(running + waiting + 0.5), Waiting: int64(waiting + 0.5), KVUsage: kv, LoRA: loraInfo(fams[MetricLoRA]), BlockSize: blockSize(fams[MetricCacheConfig])}
	el.TTFTSeconds, el.TTFTCount = histSumCount(fams[MetricTTFT])
	return el, ResultOK, nil
}

// histSumCount sums a histogram's sample sums and counts over its series
// (engines); 0, 0 when absent.
func histSumCount(f *dto.MetricFamily) (sum float64, count uint64) {
	if f == nil {
		return 0, 0
	}
	for _, m := range f.GetMetric() {
		if h := m.GetHistogram(); h != nil {
			sum += h.GetSampleSum()
			count += h.GetSampleCount()
		}
	}
	return sum, count
}

// blockSize is the block_size label of vLLM's cache_config_info (0: absent
// or not a size).
func blockSize(f *dto.MetricFamily) int {
	if f == nil {
		return 0
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != "block_size" {
				continue
			}
			if n, err := strconv.Atoi(l.GetValue()); err == nil && n > 0 && n <= 4096 {
				return n
			}
		}
	}
	return 0
}

// loraInfo reads the newest vllm:lora_requests_info series (nil: none).
func loraInfo(f *dto.MetricFamily) *fleet.LoRAState {
	var newest *dto.Metric
	best := 0.0
	for _, m := range f.GetMetric() {
		if v, ok := value(m); ok && (newest == nil || v > best) {
			newest, best = m, v
		}
	}
	if newest == nil {
		return nil
	}
	l := &fleet.LoRAState{}
	for _, lp := range newest.GetLabel() {
		switch lp.GetName() {
		case "running_lora_adapters":
			l.Running = splitAdapters(lp.GetValue())
		case "waiting_lora_adapters":
			l.Waiting = splitAdapters(lp.GetValue())
		case "max_lora", "max_loras":
			l.MaxLoRA, _ = strconv.Atoi(lp.GetValue())
		}
	}
	return l
}

// splitAdapters splits "a, b,c" into names.
func splitAdapters(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	}
	return 0, false
}

func sum(f *dto.MetricFamily) (float64, bool) {
	if f == nil {
		return 0, false
	}
	var t float64
	ok := false
	for _, m := range f.GetMetric() {
		if v, vok := value(m); vok && v >= 0 && v < 1e9 {
			t += v
			ok = true
		}
	}
	return t, ok
}

func maxOf(f *dto.MetricFamily) (float64, bool) {
	if f == nil {
		return 0, false
	}
	best, ok := 0.0, false
	for _, m := range f.GetMetric() {
		if v, vok := value(m); vok && (!ok || v > best) {
			best, ok = v, true
		}
	}
	return best, ok
}
