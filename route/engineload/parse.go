package engineload

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/turnout/turnout/route/fleet"

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

// family is the index of a metric name Parse reads in loadFamilies.
type family int

const (
	famRunning family = iota
	famWaiting
	famKV
	famKVOld
	famLoRA
	famCacheConfig
	famTTFTSum
	famTTFTCount
	numFamilies
)

// loadFamilies are the metric names Parse reads, by family.
var loadFamilies = [numFamilies][]byte{
	famRunning: []byte(MetricRunning), famWaiting: []byte(MetricWaiting), famKV: []byte(MetricKV), famKVOld: []byte(MetricKVOld),
	famLoRA: []byte(MetricLoRA), famCacheConfig: []byte(MetricCacheConfig),
	famTTFTSum: []byte(MetricTTFT + "_sum"), famTTFTCount: []byte(MetricTTFT + "_count"),
}

// Parse reads running + waiting and the KV usage from a Prometheus text
// page. Series are summed over labels (vLLM exports one series per engine
// with data parallelism); the KV usage is the highest of them.
//
// Only the sample lines of the families above are read, in place and
// without allocating (a LoRA report aside): a vLLM page is mostly
// histograms (~40-100 KiB), and a busy replica is scraped every interval,
// so what a scrape allocates is a steady share of the process's
// allocations under load (BENCHMARKS.md). A page without any of those
// lines is handed whole to the Prometheus project's parser, to tell
// garbage (parse_error) from another exporter (no_metrics).
func Parse(body []byte) (fleet.EngineLoad, Result, error) {
	var (
		sums    [numFamilies]float64
		seen    [numFamilies]bool
		lora    []byte // the newest lora_requests_info line's labels
		loraAt  float64
		blockSz int
		found   bool
	)
	for page := body; len(page) > 0; {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i], page[i+1:]
		} else {
			page = nil
		}
		f, rest := lineFamily(line)
		if f < 0 {
			continue
		}
		found = true
		labels, v, err := readSample(rest)
		if err != nil {
			return fleet.EngineLoad{}, ResultParse, fmt.Errorf("parse metrics: %.80q: %w", line, err)
		}
		switch f {
		case famRunning, famWaiting:
			if v >= 0 && v < 1e9 {
				sums[f] += v
				seen[f] = true
			}
		case famKV, famKVOld:
			if !seen[f] || v > sums[f] {
				sums[f] = v
			}
			seen[f] = true
		case famTTFTSum, famTTFTCount:
			sums[f] += v
			seen[f] = true
		case famLoRA:
			if !seen[f] || v > loraAt {
				lora, loraAt = labels, v
			}
			seen[f] = true
		case famCacheConfig:
			if blockSz == 0 {
				blockSz = blockSize(labels)
			}
		}
	}
	if !found {
		return parseWhole(body)
	}
	if !seen[famRunning] && !seen[famWaiting] {
		return fleet.EngineLoad{}, ResultNoMetrics, fmt.Errorf("no %s or %s on the page", MetricRunning, MetricWaiting)
	}
	kv := -1.0
	switch {
	case seen[famKV]:
		kv = sums[famKV]
	case seen[famKVOld]:
		kv = sums[famKVOld]
	}
	running, waiting := sums[famRunning], sums[famWaiting]
	el := fleet.EngineLoad{Requests: int64(running + waiting + 0.5), Waiting: int64(waiting + 0.5), KVUsage: kv, BlockSize: blockSz,
		TTFTSeconds: sums[famTTFTSum], TTFTCount: uint64(sums[famTTFTCount] + 0.5)}
	if seen[famLoRA] {
		el.LoRA = loraInfo(lora)
	}
	return el, ResultOK, nil
}

// parseWhole reads a page without any line Parse reads with the Prometheus
// project's parser: a parse error, or a page of another exporter.
func parseWhole(body []byte) (fleet.EngineLoad, Result, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := p.TextToMetricFamilies(bytes.NewReader(body)); err != nil {
		return fleet.EngineLoad{}, ResultParse, fmt.Errorf("parse metrics: %w", err)
	}
	return fleet.EngineLoad{}, ResultNoMetrics, fmt.Errorf("no %s or %s on the page", MetricRunning, MetricWaiting)
}

// lineFamily is the family of a sample line and what follows its name;
// -1 for any other line (comments, HELP, TYPE, other metrics).
func lineFamily(line []byte) (family, []byte) {
	for f := range loadFamilies {
		name := loadFamilies[f]
		if len(line) > len(name) && bytes.HasPrefix(line, name) {
			if c := line[len(name)]; c == '{' || c == ' ' || c == '\t' {
				return family(f), line[len(name):]
			}
		}
	}
	return -1, nil
}

var (
	errLabels = errors.New("malformed labels")
	errValue  = errors.New("malformed value")
)

// readSample reads what follows a sample's name: the label block (its
// inside is returned, still escaped) and the value; a timestamp after it
// is ignored.
func readSample(b []byte) (labels []byte, v float64, err error) {
	if len(b) > 0 && b[0] == '{' {
		n, ok := labelBlock(b)
		if !ok {
			return nil, 0, errLabels
		}
		labels, b = b[1:n-1], b[n:]
	}
	b = bytes.TrimLeft(b, " \t")
	end := bytes.IndexAny(b, " \t\r")
	if end < 0 {
		end = len(b)
	}
	if rest := bytes.Trim(b[end:], " \t\r"); len(rest) > 0 && !isInt(rest) {
		return nil, 0, errValue
	}
	if end == 0 {
		return nil, 0, errValue
	}
	v, err = strconv.ParseFloat(view(b[:end]), 64)
	if err != nil {
		return nil, 0, errValue
	}
	return labels, v, nil
}

// labelBlock is the length of the {...} block b starts with: name="value"
// pairs separated by commas (a trailing one allowed), values with \\, \"
// and \n escapes.
func labelBlock(b []byte) (int, bool) {
	i := 1
	for {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		start := i
		for i < len(b) && isNameByte(b[i], i == start) {
			i++
		}
		if i == start || i+1 >= len(b) || b[i] != '=' || b[i+1] != '"' {
			return 0, false
		}
		for i += 2; ; i++ {
			if i >= len(b) {
				return 0, false
			}
			if b[i] == '\\' {
				i++
				continue
			}
			if b[i] == '"' {
				i++
				break
			}
		}
		switch {
		case i < len(b) && b[i] == ',':
			i++
		case i < len(b) && b[i] == '}':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
}

func isInt(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// eachLabel calls fn with each name and raw (escaped) value of a label
// block's inside, as readSample returned it.
func eachLabel(labels []byte, fn func(name, raw []byte)) {
	for len(labels) > 0 {
		labels = bytes.TrimLeft(labels, " \t,")
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) {
			return
		}
		name, i := labels[:eq], eq+2
		for ; i < len(labels) && labels[i] != '"'; i++ {
			if labels[i] == '\\' {
				i++
			}
		}
		if i > len(labels) {
			return
		}
		fn(name, labels[eq+2:min(i, len(labels))])
		labels = labels[min(i+1, len(labels)):]
	}
}

// blockSize is the block_size label of vLLM's cache_config_info (0: absent
// or not a size).
func blockSize(labels []byte) int {
	n := 0
	eachLabel(labels, func(name, raw []byte) {
		if string(name) != "block_size" || len(raw) == 0 || len(raw) > 4 || !isInt(raw) || raw[0] == '-' {
			return
		}
		v := 0
		for _, c := range raw {
			v = v*10 + int(c-'0')
		}
		if v > 0 && v <= 4096 {
			n = v
		}
	})
	return n
}

// loraInfo reads the labels of the newest vllm:lora_requests_info series.
func loraInfo(labels []byte) *fleet.LoRAState {
	l := &fleet.LoRAState{}
	eachLabel(labels, func(name, raw []byte) {
		switch string(name) {
		case "running_lora_adapters":
			l.Running = splitAdapters(unescape(raw))
		case "waiting_lora_adapters":
			l.Waiting = splitAdapters(unescape(raw))
		case "max_lora", "max_loras":
			l.MaxLoRA, _ = strconv.Atoi(string(raw))
		}
	})
	return l
}

// unescape is a label value without its text-format escapes.
func unescape(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '\\' && i+1 < len(raw) {
			i++
			if c = raw[i]; c == 'n' {
				c = '\n'
			}
		}
		b.WriteByte(c)
	}
	return b.String()
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

// view is b as a string for parsing; it must not be kept.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
