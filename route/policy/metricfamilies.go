package policy

// metricFamilies are the families the policies' MetricsWriters (and
// WriteMetricsOff) write: {name, type, help}. route groups the pools'
// lines under them (promtext.Group).
var metricFamilies = [...][3]string{
	{"turnout_kv_index_blocks", "gauge", "Blocks in the pool's KV index (kv-aware; 0 for other policies)."},
	{"turnout_kv_index_capacity_blocks", "gauge", "Blocks the pool's KV index holds before it evicts (max_blocks)."},
	{"turnout_kv_index_bytes", "gauge", "Approximate heap the pool's KV index holds, in bytes."},
	{"turnout_kv_index_evictions_total", "counter", "Blocks the KV index evicted at capacity, least recently stored first."},
	{"turnout_kv_index_stale_sources", "gauge", "KV-event sources that lost events and were not replayed: their matches count half (0 for other policies)."},
	{"turnout_kv_index_block_size_tokens", "gauge", "Tokens per KV block the index keys on (block_size, or the engine's reported size)."},
	{"turnout_kv_index_skipped_total", "counter", "KV events or blocks the index could not use, by reason: orphan (unknown parent), misaligned (tokens not pairing with blocks), filtered (other media, LoRA extra keys), unknown_remove."},
	{"turnout_kv_fallbacks_total", "counter", "kv-aware decisions made by its prefix-affinity fallback, by reason (block size unknown, body truncated, tokenizer error, no token ids, short prompt, adapter: the index holds base-model blocks only)."},
	{"turnout_kv_tokenize_total", "counter", "Remote tokenizer calls (POST /tokenize) by result."},
	{"turnout_kv_token_id_prompts_total", "counter", "Requests whose prompt came as token ids (no tokenizer call)."},
	{"turnout_kv_tokenizer_cache_hits_total", "counter", "Prompts tokenized from the tokenizer cache."},
	{"turnout_kv_events_total", "counter", "KV events received per endpoint (0 for policies without KV events)."},
	{"turnout_kv_event_gaps_total", "counter", "Sequence gaps in an endpoint's KV-event stream (filled by replay or not)."},
	{"turnout_kv_event_malformed_total", "counter", "KV-event messages or payloads that could not be decoded."},
	{"turnout_kv_event_reconnects_total", "counter", "Reconnects of an endpoint's KV-event subscriber."},
	{"turnout_kv_events_rejected_total", "counter", "Single KV events dropped from good batches, by reason."},
	{"turnout_ttft_overrides_total", "counter", "predicted-ttft decisions that moved a request from prefix-affinity's choice."},
	{"turnout_ttft_model_coefficient", "gauge", "predicted-ttft's fitted model per endpoint, by term (ms)."},
}

// MetricFamilies returns the {name, type, help} of every family the
// registry's policies' metrics writers write.
func (*Registry) MetricFamilies() [][3]string { return metricFamilies[:] }

// kvFallbackNames are turnout_kv_fallbacks_total's reason label values.
var kvFallbackNames = [numKVFallbacks]string{"block_size_unknown", "body_truncated", "tokenizer_error", "no_token_ids", "short_prompt", "adapter"}

func (r KVFallback) String() string { return kvFallbackNames[r] }
