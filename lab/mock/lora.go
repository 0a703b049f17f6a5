package mock

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// LoRA adapters, as vLLM serves them: --lora-modules registers adapters at
// start, POST /v1/load_lora_adapter and /v1/unload_lora_adapter change the
// set at run time (vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING), /v1/models
// lists each with its parent, and vllm:lora_requests_info reports the
// adapters with running and waiting requests and max_lora. At most
// MaxLoRAs adapters are hot (on the GPU, an LRU); a request whose adapter
// is not hot waits LoRALoadCost first, so routing that keeps an adapter
// where it is hot shows in time to first token.

// HTTP paths of runtime LoRA updates.
const (
	PathLoadLoRA   = "/v1/load_lora_adapter"
	PathUnloadLoRA = "/v1/unload_lora_adapter"
)

// LoRAModule is one adapter given at start (--lora-modules name=path).
type LoRAModule struct {
	Name, Path string
}

// ParseLoRAModules reads "name=path,name2=path2" (a name alone: path = name).
func ParseLoRAModules(s string) ([]LoRAModule, error) {
	var out []LoRAModule
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		name, path, ok := strings.Cut(f, "=")
		if !ok {
			path = name
		}
		if name == "" || path == "" {
			return nil, fmt.Errorf("lora module %q: want name=path", f)
		}
		out = append(out, LoRAModule{Name: name, Path: path})
	}
	return out, nil
}

// loraState is the replica's adapters and hot set.
type loraState struct {
	mu       sync.Mutex
	paths    map[string]string // registered adapter -> path
	order    []string          // registration order, for /v1/models
	hot      []string          // most recent first, at most max
	max      int
	running  map[string]int
	waiting  map[string]int
	loads    int64 // adapters brought into the hot set (a switch when it was full)
	evicted  int64
	changed  int64 // unix nanos of the last change, the metric's value
	modelsFn func()
}

func newLoRAState(mods []LoRAModule, max int, onChange func()) *loraState {
	l := &loraState{paths: map[string]string{}, max: max, running: map[string]int{}, waiting: map[string]int{}, modelsFn: onChange}
	for _, m := range mods {
		if _, dup := l.paths[m.Name]; !dup {
			l.order = append(l.order, m.Name)
		}
		l.paths[m.Name] = m.Path
	}
	l.changed = time.Now().UnixNano()
	return l
}

// has reports whether name is a registered adapter.
func (l *loraState) has(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.paths[name]
	return ok
}

// arrive counts a request for the adapter as waiting.
func (l *loraState) arrive(name string) {
	l.mu.Lock()
	l.waiting[name]++
	l.changed = time.Now().UnixNano()
	l.mu.Unlock()
}

// admit moves a request from waiting to running and reports whether the
// adapter had to be loaded into the hot set (the caller charges the cost).
func (l *loraState) admit(name string) (loaded bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting[name]--; l.waiting[name] <= 0 {
		delete(l.waiting, name)
	}
	l.running[name]++
	l.changed = time.Now().UnixNano()
	for i, h := range l.hot {
		if h == name {
			copy(l.hot[1:i+1], l.hot[:i])
			l.hot[0] = name
			return false
		}
	}
	l.loads++
	l.hot = append([]string{name}, l.hot...)
	if len(l.hot) > l.max {
		l.hot = l.hot[:l.max]
		l.evicted++
	}
	return true
}

// done ends a running request.
func (l *loraState) done(name string) {
	l.mu.Lock()
	if l.running[name]--; l.running[name] <= 0 {
		delete(l.running, name)
	}
	l.changed = time.Now().UnixNano()
	l.mu.Unlock()
}

// LoRAStats are the adapter counters of a replica.
type LoRAStats struct {
	Loads, Evicted int64
	Hot            []string
}

func (l *loraState) stats() LoRAStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LoRAStats{Loads: l.loads, Evicted: l.evicted, Hot: append([]string(nil), l.hot...)}
}

// appendInfo renders vllm:lora_requests_info as vLLM does: one series whose
// labels carry the adapters (comma-separated) and whose value is the time.
func (l *loraState) appendInfo(b []byte) []byte {
	l.mu.Lock()
	run, wait := slices.Sorted(maps.Keys(l.running)), slices.Sorted(maps.Keys(l.waiting))
	max, at := l.max, l.changed
	loads, evicted := l.loads, l.evicted
	l.mu.Unlock()
	b = append(b, "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\""...)
	b = appendInt(b, int64(max))
	b = append(b, `",running_lora_adapters="`...)
	b = append(b, strings.Join(run, ",")...)
	b = append(b, `",waiting_lora_adapters="`...)
	b = append(b, strings.Join(wait, ",")...)
	b = append(b, `"} `...)
	b = appendFloat(b, float64(at)/1e9)
	b = append(b, "\n# HELP mock_lora_loads_total Adapters brought into the hot set (max_loras LRU): each cost --lora-load-cost.\n# TYPE mock_lora_loads_total counter\nmock_lora_loads_total "...)
	b = appendInt(b, loads)
	b = append(b, "\n# HELP mock_lora_evictions_total Adapters pushed out of the full hot set.\n# TYPE mock_lora_evictions_total counter\nmock_lora_evictions_total "...)
	b = appendInt(b, evicted)
	return append(b, '\n')
}

// list returns the registered adapters with their paths, in order.
func (l *loraState) list() []LoRAModule {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LoRAModule, 0, len(l.order))
	for _, n := range l.order {
		out = append(out, LoRAModule{Name: n, Path: l.paths[n]})
	}
	return out
}

// handleLoad implements POST /v1/load_lora_adapter {"lora_name","lora_path"}
// with vLLM's answers: 200 text, 400 when already loaded or incomplete.
func (s *Server) handleLoad(ctx *fasthttp.RequestCtx, load bool) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil || req.Name == "" || load && req.Path == "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
		return
	}
	l := s.lora
	l.mu.Lock()
	_, exists := l.paths[req.Name]
	switch {
	case load && exists:
		l.mu.Unlock()
		s.writeError(ctx, fasthttp.StatusBadRequest, "The lora adapter '"+req.Name+"' has already been loaded.", "InvalidUserInput")
		return
	case !load && !exists:
		l.mu.Unlock()
		s.writeError(ctx, fasthttp.StatusNotFound, "The lora adapter '"+req.Name+"' cannot be found.", "NotFoundError")
		return
	case load:
		l.paths[req.Name] = req.Path
		l.order = append(l.order, req.Name)
	default:
		delete(l.paths, req.Name)
		for i, n := range l.order {
			if n == req.Name {
				l.order = append(l.order[:i:i], l.order[i+1:]...)
				break
			}
		}
		for i, n := range l.hot {
			if n == req.Name {
				l.hot = append(l.hot[:i:i], l.hot[i+1:]...)
				break
			}
		}
	}
	l.changed = time.Now().UnixNano()
	l.mu.Unlock()
	s.refreshModels()
	if load {
		ctx.SetBodyString("Success: LoRA adapter '" + req.Name + "' added successfully.")
	} else {
		ctx.SetBodyString("Success: LoRA adapter '" + req.Name + "' removed successfully.")
	}
}

// LoRA returns the replica's adapter counters.
func (s *Server) LoRA() LoRAStats { return s.lora.stats() }
