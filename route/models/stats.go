package models

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Stats are the per-model counters (/metrics), kept across table
// rebuilds: an Entry points at its name's counters, so a decision adds to
// them with one atomic add and no lookup.
type Stats struct {
	mu sync.Mutex
	m  map[string]*ModelStats
	// limited counts, per deployment, the loads max_loads_per_minute refused.
	limited map[string]*atomic.Uint64
}

// ModelStats counts one model name's (or adapter's) requests.
type ModelStats struct {
	Deployment string
	Adapter    bool
	// Decisions routed; Refused: 404/503 because no available endpoint
	// serves it; Cold: an adapter sent where the engine's last report did
	// not list it (running or waiting), a likely load; Loads, LoadFailures,
	// Unloads: lora.load_on_demand.
	Decisions, Refused, Cold, Loads, LoadFailures, Unloads atomic.Uint64
}

// NewStats returns empty counters.
func NewStats() *Stats {
	return &Stats{m: map[string]*ModelStats{}, limited: map[string]*atomic.Uint64{}}
}

// OtherName labels the one series of the names without their own.
const OtherName = "_other"

// existing returns name's counters when it has them, else the overflow
// entry's: a name no endpoint serves gets no series of its own.
func (s *Stats) existing(name, dep string) *ModelStats {
	s.mu.Lock()
	ms := s.m[name]
	s.mu.Unlock()
	if ms != nil {
		return ms
	}
	return s.For(OtherName, dep, true)
}

// For returns name's counters, creating them (bounded like Seen: past
// MaxSeen names, new ones share one overflow entry).
func (s *Stats) For(name, dep string, adapter bool) *ModelStats {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ms := s.m[name]; ms != nil {
		return ms
	}
	if len(s.m) >= MaxSeen {
		name = OtherName
		if ms := s.m[name]; ms != nil {
			return ms
		}
	}
	ms := &ModelStats{Deployment: dep, Adapter: adapter}
	s.m[name] = ms
	return ms
}

// WriteMetrics renders the counters.
func (s *Stats) WriteMetrics(b *strings.Builder) {
	s.mu.Lock()
	names := slices.Collect(maps.Keys(s.m))
	s.mu.Unlock()
	slices.Sort(names)
	type row struct {
		metric, help string
		get          func(*ModelStats) uint64
		adapterOnly  bool
	}
	rows := []row{
		{"turnout_model_decisions_total", "Requests routed, by model name or LoRA adapter.", func(m *ModelStats) uint64 { return m.Decisions.Load() }, false},
		{"turnout_model_refused_total", "Requests refused because no available endpoint serves the model (404 never served, 503 model_unavailable).", func(m *ModelStats) uint64 { return m.Refused.Load() }, false},
		{"turnout_lora_cold_decisions_total", "Adapter requests sent where the engine's last vllm:lora_requests_info did not list the adapter (a likely load).", func(m *ModelStats) uint64 { return m.Cold.Load() }, true},
		{"turnout_lora_loads_total", "Adapters loaded on demand (lora.load_on_demand), by result.", nil, true},
		{"turnout_lora_unloads_total", "Cold adapters unloaded past lora.max_loaded.", func(m *ModelStats) uint64 { return m.Unloads.Load() }, true},
	}
	s.mu.Lock()
	deps := slices.Collect(maps.Keys(s.limited))
	s.mu.Unlock()
	slices.Sort(deps)
	b.WriteString("# HELP turnout_lora_loads_limited_total Loads on demand not started: past lora.max_loads_per_minute.\n# TYPE turnout_lora_loads_limited_total counter\n")
	for _, d := range deps {
		s.mu.Lock()
		c := s.limited[d]
		s.mu.Unlock()
		fmt.Fprintf(b, "turnout_lora_loads_limited_total{deployment=%q} %d\n", d, c.Load())
	}
	for _, r := range rows {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s counter\n", r.metric, r.help, r.metric)
		for _, n := range names {
			s.mu.Lock()
			m := s.m[n]
			s.mu.Unlock()
			if r.adapterOnly && !m.Adapter {
				continue
			}
			kind := "model"
			if m.Adapter {
				kind = "adapter"
			}
			if r.get == nil {
				fmt.Fprintf(b, "%s{deployment=%q,model=%q,result=\"ok\"} %d\n%s{deployment=%q,model=%q,result=\"failed\"} %d\n",
					r.metric, m.Deployment, n, m.Loads.Load(), r.metric, m.Deployment, n, m.LoadFailures.Load())
				continue
			}
			fmt.Fprintf(b, "%s{deployment=%q,model=%q,kind=%q} %d\n", r.metric, m.Deployment, n, kind, r.get(m))
		}
	}
}
