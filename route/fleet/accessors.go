package fleet

import "github.com/turnout/turnout/route/kv"

// The accessors of the signals (signals.go) that read the last engine
// scrape or the endpoint's KV-event source; Load, Waiting, Admits, Recent,
// Served, Inflight and PendingBytes are in endpoint.go, LoRA in models.go.

// EngineRequests is the engine's running + waiting count at the last
// scrape; ok is false when none is known.
func (e *Endpoint) EngineRequests() (n int64, ok bool) { return e.State.EngineRequests() }

// EngineTTFT is the engine's time-to-first-token histogram as of the last
// scrape.
func (e *Endpoint) EngineTTFT() TTFTHistogram { return TTFTHistogram{e.State.engine.Load()} }

// TTFTHistogram is one scrape's time-to-first-token histogram (vLLM's
// time_to_first_token_seconds sum and count, cumulative). Two values are
// equal when read from the same published figure: a scrape, or its copy
// the ledger's reconciliation republishes (State.Unmark).
type TTFTHistogram struct{ el *EngineLoad }

// Known reports whether a scrape is known.
func (h TTFTHistogram) Known() bool { return h.el != nil }

// Seconds is the histogram's sum (0: not reported, or no scrape).
func (h TTFTHistogram) Seconds() float64 {
	if h.el == nil {
		return 0
	}
	return h.el.TTFTSeconds
}

// Count is the histogram's count (0: not reported, or no scrape).
func (h TTFTHistogram) Count() uint64 {
	if h.el == nil {
		return 0
	}
	return h.el.TTFTCount
}

// KVBlockSize is the engine's KV block size in tokens at the last scrape
// (vLLM's cache_config_info; 0: not reported, or no scrape).
func (e *Endpoint) KVBlockSize() int {
	if el := e.State.engine.Load(); el != nil {
		return el.BlockSize
	}
	return 0
}

// KVSource is where the endpoint's KV events come from: its own publisher
// (kv_events, dialled) or the bound socket they arrive on (kv_events_bind,
// matched by topic); ok is false when it has neither.
func (e *Endpoint) KVSource() (src kv.Endpoint, ok bool) {
	switch {
	case e.KVEvents != "":
		return kv.Endpoint{Name: e.Name, Address: e.KVEvents, Topic: e.KVTopic, ReplayAddress: e.KVReplay}, true
	case e.KVBind != "":
		return kv.Endpoint{Name: e.Name, Bind: e.KVBind, Pattern: e.KVPattern, ReplayAddress: e.KVReplay}, true
	}
	return kv.Endpoint{}, false
}
