package mock

import "strconv"

// appendMetrics renders Prometheus text with vLLM's metric names so turnout's
// scraper can be tested against the mock unchanged. The label is the first
// served model, as vLLM labels by its single served model name.
func (s *Server) appendMetrics(b []byte) []byte {
	label := `{model_name=` + string(appendJSONString(nil, s.cfg.Models[0])) + `}`
	st := s.Stats()
	usage := float64(st.CacheBlocks) / float64(s.cache.Capacity())

	metric := func(name, typ, help string, v float64) {
		b = append(b, "# HELP "...)
		b = append(b, name...)
		b = append(b, ' ')
		b = append(b, help...)
		b = append(b, "\n# TYPE "...)
		b = append(b, name...)
		b = append(b, ' ')
		b = append(b, typ...)
		b = append(b, '\n')
		b = append(b, name...)
		b = append(b, label...)
		b = append(b, ' ')
		b = appendFloat(b, v)
		b = append(b, '\n')
	}
	metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", float64(st.Running))
	metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float64(st.Waiting))
	metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
	// Pre-v0.10 name of the same gauge, for scrapers written against older vLLM.
	metric("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", usage)
	// vLLM's cache config as labels; kv-aware reads block_size from it.
	b = append(b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\""...)
	b = strconv.AppendInt(b, int64(s.cfg.BlockSize), 10)
	b = append(b, "\",cache_dtype=\"auto\",enable_prefix_caching=\"True\"} 1.0\n"...)
	// vLLM's TTFT histogram, sum and count only (one +Inf bucket): what
	// turnout's scraper reads to learn TTFT per replica.
	b = append(b, "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_bucket"...)
	b = append(b, label[:len(label)-1]...)
	b = append(b, `,le="+Inf"} `...)
	b = strconv.AppendInt(b, s.ttftCount.Load(), 10)
	b = append(b, "\nvllm:time_to_first_token_seconds_sum"...)
	b = append(b, label...)
	b = append(b, ' ')
	b = appendFloat(b, float64(s.ttftNs.Load())/1e9)
	b = append(b, "\nvllm:time_to_first_token_seconds_count"...)
	b = append(b, label...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, s.ttftCount.Load(), 10)
	b = append(b, '\n')
	metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", float64(st.PromptTokens))
	metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", float64(st.CachedTokens))
	metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(st.PromptTokens))
	metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", float64(st.CompletionTokens))
	metric("mock_requests_total", "counter", "Completion requests received by the mock, including injected failures.", float64(st.Requests))
	metric("mock_prompt_tokens_total", "counter", "Prompt tokens of requests admitted by the mock.", float64(st.PromptTokens))
	metric("mock_failed_requests_total", "counter", "Requests answered 500 by the fail_rate fault.", float64(st.Failed))
	if s.cfg.EnableLoRA {
		b = s.lora.appendInfo(b)
	}
	return b
}
