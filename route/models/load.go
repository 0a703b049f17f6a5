package models

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Loading adapters on demand (lora.load_on_demand): a request names an
// adapter no endpoint holds, the deployment's policy picks an endpoint, and
// turnout asks it to load the adapter (vLLM's POST /v1/load_lora_adapter,
// VLLM_ALLOW_RUNTIME_LORA_UPDATING) before answering; past lora.max_loaded
// adapters loaded this way on one endpoint, the least recently routed one
// is unloaded. Off the allocation-free path: a load is rare and slow.

// vLLM's runtime LoRA paths.
const (
	LoadPath   = "/v1/load_lora_adapter"
	UnloadPath = "/v1/unload_lora_adapter"
)

// DefaultLoadTimeout bounds a load when lora.load_timeout is 0.
const DefaultLoadTimeout = 10 * time.Second

// Loadable reports whether deployment dc loads adapter name on demand:
// load_on_demand is on and the operator named it (lora.allow, a key of
// adapter_paths), or, with lora.load_patterns, it matches lora.adapters.
// A name a client makes up is never loaded on a pattern alone.
func Loadable(dc *config.DeploymentConfig, name string) bool {
	l := &dc.LoRA
	if !l.LoadOnDemand || name == "" || len(name) > 256 {
		return false
	}
	if _, ok := l.AdapterPaths[name]; ok || slices.Contains(l.Allow, name) {
		return true
	}
	if !l.LoadPatterns {
		return false
	}
	for _, pat := range l.Adapters {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}

// Loader calls replicas' runtime LoRA API and remembers what it loaded.
type Loader struct {
	Client *http.Client
	mu     sync.Mutex
	// loaded: endpoint address -> adapter -> last routed (unix nanos).
	loaded map[string]map[string]int64
	// rates bound each deployment's loads (lora.max_loads_per_minute).
	rates map[string]*rate.Limiter
}

// NewLoader returns a loader with its own HTTP client.
func NewLoader() *Loader {
	return &Loader{Client: &http.Client{}, loaded: map[string]map[string]int64{}, rates: map[string]*rate.Limiter{}}
}

// mayLoad takes one load of deployment dep's lora.max_loads_per_minute;
// false when the minute's loads are spent. The burst is a tenth of the
// minute's loads (at least one): a flood of names cannot start them all
// at once.
func (l *Loader) mayLoad(dep string, dc *config.DeploymentConfig) bool {
	perMin := dc.LoRA.LoadsPerMinute()
	every := rate.Limit(float64(perMin) / 60)
	burst := max(1, perMin/10)
	l.mu.Lock()
	lim := l.rates[dep]
	if lim == nil || lim.Limit() != every || lim.Burst() != burst {
		lim = rate.NewLimiter(every, burst)
		l.rates[dep] = lim
	}
	l.mu.Unlock()
	return lim.Allow()
}

// Load asks the endpoint to load the adapter (already loaded is success)
// and returns the adapter to unload past maxLoaded ("" = none).
func (l *Loader) Load(ctx context.Context, dc *config.DeploymentConfig, e *fleet.Endpoint, name string) (evict string, err error) {
	lp := dc.LoRA.AdapterPaths[name]
	if lp == "" {
		lp = name
	}
	body, _ := json.Marshal(map[string]string{"lora_name": name, "lora_path": lp})
	status, msg, err := l.post(ctx, e.Address, LoadPath, body)
	switch {
	case err != nil:
		return "", err
	case status == http.StatusBadRequest && strings.Contains(msg, "already been loaded"):
	case status != http.StatusOK:
		return "", fmt.Errorf("%s%s answered %d: %s", e.Address, LoadPath, status, msg)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.loaded[e.Address]
	if m == nil {
		m = map[string]int64{}
		l.loaded[e.Address] = m
	}
	m[name] = time.Now().UnixNano()
	if max := dc.LoRA.MaxLoaded; max > 0 && len(m) > max {
		var oldest int64
		for a, t := range m {
			if a != name && (evict == "" || t < oldest) {
				evict, oldest = a, t
			}
		}
		delete(m, evict)
	}
	return evict, nil
}

// Touch notes that adapter name was routed to the endpoint (the unload order).
func (l *Loader) Touch(addr string, name []byte) {
	l.mu.Lock()
	if m := l.loaded[addr]; m != nil {
		if _, ok := m[string(name)]; ok {
			m[string(name)] = time.Now().UnixNano()
		}
	}
	l.mu.Unlock()
}

// Unload asks the endpoint to unload the adapter.
func (l *Loader) Unload(ctx context.Context, addr, name string) error {
	body, _ := json.Marshal(map[string]string{"lora_name": name})
	status, msg, err := l.post(ctx, addr, UnloadPath, body)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("%s%s answered %d: %s", addr, UnloadPath, status, msg)
	}
	return nil
}

func (l *Loader) post(ctx context.Context, addr, p string, body []byte) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+p, bytes.NewReader(body))
	if err != nil {
		return 0, "", fmt.Errorf("lora: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := l.Client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("lora: %w", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	return res.StatusCode, string(b), nil
}
