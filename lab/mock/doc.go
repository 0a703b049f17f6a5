// Package mock is an OpenAI-compatible stand-in for a vLLM replica, used
// by turnout's end-to-end tests, demo and benchmarks.
//
// It simulates what a router can observe of vLLM: the prefix cache (words are
// tokens via TokenID, full blocks of BlockSize tokens keyed by chained
// HashBlock hashes, an LRU of CacheBlocks blocks touched in reverse so shared
// prefixes are evicted last, KV events through KVEventSink), the timing model
// (TTFT = overhead + uncached tokens × per-token prefill, then a fixed
// inter-token latency; at most MaxRunning sequences run, the rest wait FIFO;
// TimeScale multiplies everything), vLLM's NIXL prefill/decode handshake
// (kv_transfer_params), LoRA adapters (lora.go: an LRU of MaxLoRAs hot
// adapters, LoRALoadCost per miss) and injectable faults. Cache, Timing and Scheduler are
// exported so an in-process simulator uses the same logic without HTTP.
//
// Endpoints (every response carries X-Replica: Config.Name):
//
//	POST /v1/chat/completions   chat, streaming (SSE) or not; usage with cached_tokens
//	POST /v1/completions        prompt as string, strings, token ids or token id lists
//	GET  /v1/models             configured model names, then adapters with "parent"
//	POST /v1/load_lora_adapter  {"lora_name","lora_path"}: 200, 400 when already loaded (EnableLoRA)
//	POST /v1/unload_lora_adapter {"lora_name"}: 200, 404 when unknown (EnableLoRA)
//	GET  /health                200, or 503 when the Unhealthy fault is on
//	GET  /metrics               Prometheus text, vLLM metric names (vllm:lora_requests_info with EnableLoRA)
//	POST /tokenize              vLLM's shape, same tokenizer/template as the cache
//	POST /reset_prefix_cache    empties the cache (AllBlocksCleared)
//	GET  /mock/faults           current fault knobs
//	POST /mock/faults           {"fail_rate","stall_ms"|"stall","die_after_chunks","unhealthy","seed"}, all optional
//	GET  /mock/requests         recent requests: [{"method","path","body","headers","received_ns"}]
//	POST /mock/requests/clear   empties that log
//
// Errors use the OpenAI shape {"error":{"message","type","param","code"}}.
package mock
