package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/turnout/turnout/route/fleet"
)

// LoRA adapters in the replay: every request names one of
// Adapters adapters, drawn with Zipf popularity; every replica can serve
// every adapter but holds at most MaxLoRAs at once (vLLM's --max-loras, an
// LRU), and a request whose adapter is not held waits LoRALoadCost before
// its prefill (the mock's --lora-load-cost). The row counts the loads
// (adapter switches).

// LoRAOptions shape the adapter mix of a replay (Adapters 0: none).
type LoRAOptions struct {
	Adapters int
	// Zipf is the popularity exponent s (> 1): adapter k is drawn with
	// weight 1/(k+1)^s.
	Zipf         float64
	MaxLoRAs     int
	LoRALoadCost time.Duration
	// PerRequest draws every request's adapter on its own instead of one
	// per prompt root (WithAdapters).
	PerRequest bool
}

// DefaultLoRAOptions: 20 adapters, s = 1.1, 4 hot per replica, 200 ms per
// load (the mock's default).
func DefaultLoRAOptions() LoRAOptions {
	return LoRAOptions{Zipf: 1.1, MaxLoRAs: 4, LoRALoadCost: 200 * time.Millisecond}
}

// Validate checks the options.
func (o *LoRAOptions) Validate() error {
	switch {
	case o.Adapters == 0:
		return nil
	case o.Adapters < 0 || o.Adapters > 10000:
		return fmt.Errorf("adapters %d out of range [0, 10000]", o.Adapters)
	case o.Zipf <= 1:
		return fmt.Errorf("adapter zipf %v must be > 1", o.Zipf)
	case o.MaxLoRAs < 1 || o.MaxLoRAs > 64:
		return fmt.Errorf("max loras %d out of range [1, 64]", o.MaxLoRAs)
	case o.LoRALoadCost < 0:
		return fmt.Errorf("lora load cost %v must be >= 0", o.LoRALoadCost)
	}
	return nil
}

// AdapterName is adapter k's model name.
func AdapterName(k int) string { return "lora-" + strconv.Itoa(k) }

// WithAdapters returns a copy of reqs whose Model is a Zipf-drawn adapter
// (seeded: every policy replays the same mix). The draw is one per prompt
// root (the first hash id; else the session; else the request; each
// request with PerRequest): an
// application sends its own prompts through its own adapter, and as the
// engine keys cached blocks by adapter, per-request draws would turn a
// conversation's shared prefix into misses no routing could avoid.
func WithAdapters(reqs []Request, o LoRAOptions, seed uint64) []Request {
	out := append([]Request(nil), reqs...)
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, 0x10a)), o.Zipf, 1, uint64(o.Adapters-1))
	byRoot := map[string]string{}
	for i := range out {
		r := &out[i]
		root := ""
		switch {
		case o.PerRequest:
		case len(r.HashIDs) > 0:
			root = "h" + strconv.FormatUint(r.HashIDs[0], 10)
		case r.Session != "":
			root = "s" + r.Session
		}
		if a, ok := byRoot[root]; ok && root != "" {
			r.Model = a
			continue
		}
		r.Model = AdapterName(int(z.Uint64()))
		if root != "" {
			byRoot[root] = r.Model
		}
	}
	return out
}

// loraSlots is one simulated replica's hot adapters, most recent first.
type loraSlots struct {
	hot     []string
	running map[string]int
}

// use brings the adapter into the hot set; it reports whether it had to be
// loaded.
func (l *loraSlots) use(name string, max int) bool {
	if l.running == nil {
		l.running = map[string]int{}
	}
	l.running[name]++
	for i, h := range l.hot {
		if h == name {
			copy(l.hot[1:i+1], l.hot[:i])
			l.hot[0] = name
			return false
		}
	}
	l.hot = append(l.hot, "")
	copy(l.hot[1:], l.hot)
	l.hot[0] = name
	if len(l.hot) > max {
		l.hot = l.hot[:max]
	}
	return true
}

func (l *loraSlots) done(name string) {
	if l.running[name]--; l.running[name] <= 0 {
		delete(l.running, name)
	}
}

// LoRAReporter is implemented by routers that read the engines' LoRA
// reports (turnout: vllm:lora_requests_info, scraped every
// ScrapeInterval); the sim calls it at each modelled scrape.
type LoRAReporter interface {
	ReportLoRA(replica int, running, waiting []string, maxLoRA int)
}

// ReportLoRA implements LoRAReporter.
func (t *turnoutRouter) ReportLoRA(replica int, running, waiting []string, maxLoRA int) {
	if e := t.endpoint(replica); e != nil {
		e.SetLoRA(&fleet.LoRAState{Running: running, Waiting: waiting, MaxLoRA: maxLoRA})
	}
}

// serveAdapters tells turnout every replica serves every adapter (as its
// /v1/models poll would find).
func (t *turnoutRouter) serveAdapters(model string, n int) {
	list := []fleet.ServedModel{{ID: model}}
	for k := 0; k < n; k++ {
		list = append(list, fleet.ServedModel{ID: AdapterName(k), Parent: model})
	}
	for _, e := range t.srv.Snapshot().Deployments[0].Serve.Endpoints {
		e.SetServed(&fleet.ServedModels{Models: list, Source: fleet.ModelsListed})
	}
	t.srv.RefreshModels()
}
