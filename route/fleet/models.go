package fleet

import (
	"sync/atomic"
	"time"
)

// Models and LoRA adapters an endpoint serves (route/models builds the
// per-model endpoint sets from them; route/health and route/engineload
// learn them).

// Mask is a set of a pool's endpoints by Index: the endpoints that serve a
// request's model. The nil Mask holds every endpoint, so a model every
// replica serves costs one nil test per candidate; an empty set is a
// non-nil Mask with no bit set.
type Mask []uint64

// NewMask returns an empty set for a pool of n endpoints (never nil).
func NewMask(n int) Mask { return make(Mask, max(1, (n+63)/64)) }

// Has reports whether endpoint index i is in the set.
func (m Mask) Has(i int) bool {
	return m == nil || i>>6 < len(m) && m[i>>6]>>(uint(i)&63)&1 != 0
}

// Set adds endpoint index i.
func (m Mask) Set(i int) { m[i>>6] |= 1 << (uint(i) & 63) }

// Count is how many endpoints the set holds (-1: every one, nil).
func (m Mask) Count() int {
	if m == nil {
		return -1
	}
	n := 0
	for _, w := range m {
		for ; w != 0; w &= w - 1 {
			n++
		}
	}
	return n
}

// ServedModel is one entry of an endpoint's model list: a base model
// (Parent "") or a LoRA adapter with the base it applies to.
type ServedModel struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
}

// Model sources, most authoritative first.
const (
	ModelsPinned = "pinned" // the config (endpoint or pool models:)
	ModelsLabels = "labels" // Kubernetes pod labels
	ModelsListed = "listed" // GET /v1/models
)

// ServedModels is what an endpoint was last known to serve.
type ServedModels struct {
	Models []ServedModel
	Source string
}

// Serves reports whether id is in the list.
func (s *ServedModels) Serves(id string) bool {
	for i := range s.Models {
		if s.Models[i].ID == id {
			return true
		}
	}
	return false
}

// LoRAState is an endpoint's LoRA slots as its engine last reported them
// (vLLM's vllm:lora_requests_info): adapters with running and waiting
// requests, and how many adapters fit on the GPU at once.
type LoRAState struct {
	Running, Waiting []string
	MaxLoRA          int
}

// Hot reports whether the adapter is in the running or waiting set.
func (l *LoRAState) Hot(model []byte) bool {
	for _, a := range l.Running {
		if a == string(model) {
			return true
		}
	}
	for _, a := range l.Waiting {
		if a == string(model) {
			return true
		}
	}
	return false
}

// Slots is how many distinct adapters the engine holds now.
func (l *LoRAState) Slots() int { return len(l.Running) + len(l.Waiting) }

// modelState is the part of State the model learners write.
type modelState struct {
	served atomic.Pointer[ServedModels]
	lora   atomic.Pointer[LoRAState]
}

// ServedModels is what the endpoint was last known to serve (nil: unknown).
func (e *Endpoint) ServedModels() *ServedModels { return e.State.models.served.Load() }

// ModelsKnown reports whether the endpoint's whole model list is known:
// pinned in the config or listed by its GET /v1/models (pod labels name
// only the base model, not the adapters).
func (e *Endpoint) ModelsKnown() bool {
	sm := e.ServedModels()
	return sm != nil && (sm.Source == ModelsPinned || sm.Source == ModelsListed)
}

// ModelsPending reports whether the endpoint passed a health check, may
// receive requests, and its model list is not known yet, less than wait
// after it came up (now in unix ns): /readyz waits for it, and a model no
// list names is answered 503, not 404, meanwhile. Past wait it is not
// pending any more (ModelsOverdue).
func (e *Endpoint) ModelsPending(now int64, wait time.Duration) bool {
	up := e.State.UpAt.Load()
	return up != 0 && now-up < int64(wait) && e.Available() && !e.ModelsKnown()
}

// ModelsUnknown reports whether the endpoint may serve a name that no
// known list names: active health checks are on (checks; without them
// there is no evidence either way), it is not draining, its list is not
// known, and it never came up or came up less than wait ago (now in unix
// ns). A replica not started yet may serve any adapter, so such a name is
// answered 503, not 404.
func (e *Endpoint) ModelsUnknown(now int64, wait time.Duration, checks bool) bool {
	if !checks || e.Draining || e.ModelsKnown() {
		return false
	}
	up := e.State.UpAt.Load()
	return up == 0 || now-up < int64(wait)
}

// ModelsOverdue reports whether the endpoint is up and its model list is
// still unknown wait after it came up: readiness stopped waiting for it.
func (e *Endpoint) ModelsOverdue(now int64, wait time.Duration) bool {
	up := e.State.UpAt.Load()
	return up != 0 && now-up >= int64(wait) && e.Available() && !e.ModelsKnown()
}

// SetServed publishes the endpoint's model list (nil: unknown again).
func (e *Endpoint) SetServed(s *ServedModels) { e.State.models.served.Store(s) }

// LoRA is the engine's last LoRA report (nil: none).
func (e *Endpoint) LoRA() *LoRAState { return e.State.models.lora.Load() }

// SetLoRA publishes a LoRA report.
func (e *Endpoint) SetLoRA(l *LoRAState) { e.State.models.lora.Store(l) }
