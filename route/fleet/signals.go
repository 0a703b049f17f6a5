package fleet

import (
	"fmt"
	"strings"
)

// Signal names one figure a policy reads of an endpoint. Each is reached
// through exactly one accessor (SignalInfo.Accessor, a method of Endpoint
// unless said otherwise) and fed by producers (the engine scraper, the
// KV-event subscriptions, completion feedback, ...). Policies and their
// stages declare the signals they read (Consumer); the config check says
// which consumed signal no configured producer feeds (route/signals.go),
// and TestPolicySignals (route/policy) fails when a policy reads an
// endpoint through anything else than these accessors, or reads a signal
// it does not declare.
type Signal uint8

// The signals; keep signalTable in the same order.
const (
	SignalAvailable   Signal = iota // Available: healthy, not draining, not stalled
	SignalLoad                      // Load: running + waiting, moved by the decisions since the scrape
	SignalInflight                  // Inflight: this instance's open decisions
	SignalPending                   // PendingBytes: uncached prompt bytes of open predicted decisions
	SignalRecent                    // Recent: decisions since the last scrape window
	SignalServed                    // Served: decisions over the last one to two windows
	SignalWaiting                   // Waiting: the engine's waiting requests
	SignalAdmits                    // Admits: whether one more request starts at once
	SignalEngineQueue               // EngineRequests: the engine's running + waiting at its scrape
	SignalEngineTTFT                // EngineTTFT: the engine's time-to-first-token histogram
	SignalKVBlockSize               // KVBlockSize: the engine's KV block size in tokens
	SignalAdapters                  // LoRA: the engine's LoRA adapters, running and waiting
	SignalKVEvents                  // KVSource: the replica's KV-event publisher
	SignalFirstToken                // TTFTLearner.LearnTTFT: completions' first-token times
	NumSignals
)

// Producer is what feeds signals: a part of turnout that runs when the
// config turns it on.
type Producer uint8

// The producers; keep producerTable in the same order.
const (
	ProducerDecisions     Producer = iota // this instance's decisions (the ledger): always on
	ProducerFeedback                      // completion feedback closes decisions
	ProducerEngineMetrics                 // each replica's /metrics, scraped
	ProducerFirstToken                    // the proxies' first-token timers, with feedback
	ProducerKVEvents                      // the engines' KV-event publishers
	ProducerHealth                        // active health checks, stall detection
	ProducerCluster                       // other turnout instances over NATS
	NumProducers
)

// SignalInfo describes a signal: its name, its one accessor, the producers
// any one of which feeds it (none: always fed), those that refine it when
// on, and what a consumer gets when nothing feeds it.
type SignalInfo struct {
	Name, Accessor string
	Needs, Also    Producers
	Without        string
}

// ProducerInfo names a producer and the config that turns it on.
type ProducerInfo struct {
	Name, Config string
}

var signalTable = [NumSignals]SignalInfo{
	SignalAvailable: {Name: "available", Accessor: "Available", Also: Of(ProducerHealth, ProducerFeedback),
		Without: "every endpoint not draining counts as up"},
	SignalLoad: {Name: "load", Accessor: "Load", Needs: Of(ProducerFeedback, ProducerEngineMetrics), Also: Of(ProducerDecisions, ProducerCluster),
		Without: "decisions close only at decision_ttl: loads only grow and the balance drifts"},
	SignalInflight: {Name: "inflight", Accessor: "Inflight", Needs: Of(ProducerFeedback, ProducerEngineMetrics), Also: Of(ProducerDecisions),
		Without: "decisions close only at decision_ttl: in-flight counts only grow"},
	SignalPending: {Name: "pending", Accessor: "PendingBytes", Needs: Of(ProducerFeedback, ProducerEngineMetrics), Also: Of(ProducerDecisions),
		Without: "predicted decisions close only at decision_ttl: queued prefill bytes only grow"},
	SignalRecent: {Name: "recent", Accessor: "Recent", Needs: Of(ProducerEngineMetrics), Also: Of(ProducerDecisions, ProducerCluster),
		Without: "no scrape opens a window: every endpoint reads 0 recent decisions"},
	SignalServed: {Name: "served", Accessor: "Served", Needs: Of(ProducerEngineMetrics), Also: Of(ProducerDecisions, ProducerCluster),
		Without: "no scrape opens a window: every endpoint reads 0 served, the bounded-load test never acts"},
	SignalWaiting: {Name: "waiting", Accessor: "Waiting", Needs: Of(ProducerEngineMetrics), Also: Of(ProducerDecisions),
		Without: "no waiting count is known (ok false)"},
	SignalAdmits: {Name: "admits", Accessor: "Admits", Needs: Of(ProducerEngineMetrics),
		Without: "no endpoint admits a request above the lowest load"},
	SignalEngineQueue: {Name: "engine_queue", Accessor: "EngineRequests", Needs: Of(ProducerEngineMetrics),
		Without: "no engine queue is known (ok false)"},
	SignalEngineTTFT: {Name: "engine_ttft", Accessor: "EngineTTFT", Needs: Of(ProducerEngineMetrics),
		Without: "no engine TTFT histogram: a replica whose first tokens are not fed back teaches nothing"},
	SignalKVBlockSize: {Name: "kv_block_size", Accessor: "KVBlockSize", Needs: Of(ProducerEngineMetrics),
		Without: "the block size is known only from the first KV event (or params.block_size)"},
	SignalAdapters: {Name: "adapters", Accessor: "LoRA", Needs: Of(ProducerEngineMetrics),
		Without: "no engine LoRA report: the hot sets are turnout's own guesses, max_loras the slots"},
	SignalKVEvents: {Name: "kv_events", Accessor: "KVSource", Needs: Of(ProducerKVEvents),
		Without: "no KV events: every request falls back to the policy's fallback"},
	SignalFirstToken: {Name: "first_token", Accessor: "TTFTLearner.LearnTTFT", Needs: Of(ProducerFirstToken),
		Without: "no first-token times: predictions learn only from the engines' histograms, or not at all"},
}

var producerTable = [NumProducers]ProducerInfo{
	ProducerDecisions:     {Name: "decisions", Config: "(always)"},
	ProducerFeedback:      {Name: "feedback", Config: "feedback (off with feedback.disable)"},
	ProducerEngineMetrics: {Name: "engine_metrics", Config: "engine_metrics (off with engine_metrics.disable)"},
	ProducerFirstToken:    {Name: "first_token", Config: "proxy.first_token_timing (default true) with feedback"},
	ProducerKVEvents:      {Name: "kv_events", Config: "an endpoint's kv_events, or kv_events_bind"},
	ProducerHealth:        {Name: "health", Config: "health (off with health.disable)"},
	ProducerCluster:       {Name: "cluster", Config: "cluster.nats"},
}

// Info describes s.
func (s Signal) Info() SignalInfo { return signalTable[s] }

func (s Signal) String() string { return signalTable[s].Name }

// Info describes p.
func (p Producer) Info() ProducerInfo { return producerTable[p] }

func (p Producer) String() string { return producerTable[p].Name }

// Signals is a set of signals.
type Signals uint32

// Producers is a set of producers.
type Producers uint16

// SignalSet is the set of the given signals.
func SignalSet(s ...Signal) Signals {
	var out Signals
	for _, x := range s {
		out |= 1 << x
	}
	return out
}

// Of is the set of the given producers.
func Of(p ...Producer) Producers {
	var out Producers
	for _, x := range p {
		out |= 1 << x
	}
	return out
}

// Has reports whether s holds x.
func (s Signals) Has(x Signal) bool { return s&(1<<x) != 0 }

// List is s in Signal order.
func (s Signals) List() []Signal { return members(uint64(s), NumSignals) }

func (s Signals) String() string { return joinNames(s.List(), ",") }

// Has reports whether p holds x.
func (p Producers) Has(x Producer) bool { return p&(1<<x) != 0 }

// List is p in Producer order.
func (p Producers) List() []Producer { return members(uint64(p), NumProducers) }

func (p Producers) String() string { return joinNames(p.List(), "+") }

// members lists the values below n whose bits are set in bits.
func members[T ~uint8](bits uint64, n T) []T {
	var out []T
	for x := range n {
		if bits&(1<<x) != 0 {
			out = append(out, x)
		}
	}
	return out
}

// joinNames joins the names of xs with sep.
func joinNames[T fmt.Stringer](xs []T, sep string) string {
	names := make([]string, len(xs))
	for i, x := range xs {
		names[i] = x.String()
	}
	return strings.Join(names, sep)
}

// Consumer is implemented by policies and stages that read endpoint
// signals: Signals is every signal they may read (a composed policy, the
// union of its stages'). It is asked at config load, never per decision.
type Consumer interface {
	Signals() Signals
}

// SignalsOf is what p declares it reads (0: p is no Consumer).
func SignalsOf(p any) Signals {
	if c, ok := p.(Consumer); ok {
		return c.Signals()
	}
	return 0
}

// Feeds is which of the producers on feed s (its Needs and Also among
// them; ProducerDecisions is always on); fed is false when s needs a
// producer and none is on.
func Feeds(s Signal, on Producers) (by Producers, fed bool) {
	on |= Of(ProducerDecisions)
	in := signalTable[s]
	return (in.Needs | in.Also) & on, in.Needs == 0 || in.Needs&on != 0
}

// Unfed is the signals of want that no producer of on feeds.
func Unfed(want Signals, on Producers) Signals {
	var out Signals
	for _, s := range want.List() {
		if _, fed := Feeds(s, on); !fed {
			out |= 1 << s
		}
	}
	return out
}
